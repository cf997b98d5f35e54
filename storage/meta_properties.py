"""``meta.properties``: which cluster and node a data directory belongs to (Kafka's file of that name).

Every directory a node writes (a controller's ``metadata.log.dir``, each of a broker's ``log.dirs``)
holds one, written on the node's first start there. A node configured with another ``node.id`` or
``cluster.id`` than the file names refuses to start and changes nothing: a copied config, a swapped
mount or a directory path typed wrong would otherwise make one node serve another's replicas (or
join another cluster's quorum with its old journal).
"""

from __future__ import annotations

from pathlib import Path

from proto import errors
from storage.checkpoints import write_atomically

FILE_NAME = "meta.properties"


def read(directory: Path) -> dict[str, str] | None:
    """The file's ``key=value`` pairs, None when it does not exist."""
    path = directory / FILE_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise errors.InvalidConfigError(f"{path} is unreadable: {e}") from e
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


def check_or_write(directory: Path, cluster_id: str, node_id: int) -> bool:
    """Refuse (InvalidConfigError, naming the file and both values) when ``directory`` belongs to another
    node or cluster; write the file when it has none. An empty ``cluster_id`` is not checked. True when the
    file was written now: the directory is new (a first start, or a replaced or wiped disk)."""
    expected = {"cluster.id": cluster_id, "node.id": str(node_id)}
    found = read(directory)
    path = directory / FILE_NAME
    if found is None:
        directory.mkdir(parents=True, exist_ok=True)
        write_atomically(path, "".join(f"{k}={v}\n" for k, v in expected.items()).encode("utf-8"))
        return True
    for key, value in expected.items():
        if key == "cluster.id" and not value:
            continue
        if key not in found:
            raise errors.InvalidConfigError(
                f"{path} names no {key} (this node is configured with '{value}'): delete the file only if the "
                f"directory is this node's")
        if found[key] != value:
            raise errors.InvalidConfigError(
                f"{path}: {key} is '{found[key]}', this node is configured with '{value}' "
                f"(the directory belongs to another {'node' if key == 'node.id' else 'cluster'})")
    return False
