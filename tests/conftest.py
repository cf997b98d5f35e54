"""Suite-wide test setup.

Test folders are not packages; pytest's default (prepend) import mode puts each
conftest's folder on sys.path, so this file makes the shared helpers in tests/ (such as
``waiting.wait_for``) importable from every folder.
"""
