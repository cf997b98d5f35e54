// Drives KafkaJS (a Kafka client in JavaScript that nobody at Brook wrote) for
// tests/kafka_compat/test_kafkajs.py. One JSON argument says what to do; every result is one JSON
// line on stdout, KafkaJS's own log goes to stderr. Usage: node driver.js '{"op": ..., ...}'
//
//   connection: {brokers: [...], ssl?: {ca, cert, key} (file paths), sasl?: {mechanism, username, password}}
//   op "admin":    calls: [[method, ...args], ...]  -> {call, ok} or {call, error} per call, in order
//                  ({call: "connect", error} alone when it cannot connect)
//   op "produce":  topic, count, batch, paceMs, idempotent, acks, compression ("none"|"gzip"), prefix,
//                  key, headers, timestamp, partitions (record i goes to i % partitions)
//                  -> {acked: [[i, partition, offset], ...]} per send (with partitions, else {answers, numbers}),
//                  {failed: [i, ...], error} per failed send, then {done: true}
//   op "consume":  topic, group, expected, timeoutMs, readUncommitted (KafkaJS's default: false, read_committed)
//                  -> {records: [[p, offset, key, value, headers, ts], ...]}
//                  once `expected` records arrived (or at the deadline), after committing them
//   op "transaction": transactionalId, topic, partitions, count, transactions: [[name, "commit"|"abort"], ...]
//                  -> per transaction, in order, one producer: {transaction: name, outcome,
//                  acked: [[i, partition, offset, value], ...]} once it committed or aborted (record i, value
//                  `${name}-${i}`, goes to partition i % partitions), or {transaction: name, error, ms} and no
//                  more; then {done: true}
//   op "member":   topic, group, heartbeatMs, sessionMs -> {assigned: {topic: [p, ...]}} at each join,
//                  {record: [p, offset, value]} per record; on SIGTERM it leaves the group: {left: true}
'use strict';

const fs = require('fs');
const { Kafka, logLevel, CompressionTypes } = require('kafkajs');

const args = JSON.parse(process.argv[2]);
const out = (obj) => process.stdout.write(JSON.stringify(obj) + '\n');
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const describe = (e) => ({
  name: e.name, type: e.type, code: e.code, message: e.message, retriable: e.retriable,
  errors: Array.isArray(e.errors) ? e.errors.map(describe) : undefined, // a KafkaJSAggregateError's parts
});

function toStderr() {
  return ({ namespace, level, label, log }) => {
    process.stderr.write(`${label} [${namespace}] ${log.message} ${JSON.stringify(log)}\n`);
  };
}

function kafka() {
  const config = {
    clientId: args.clientId || 'brook-kafkajs-compat',
    brokers: args.brokers,
    logLevel: logLevel.WARN,
    logCreator: toStderr,
    connectionTimeout: 10000,
    requestTimeout: 30000,
    retry: { retries: args.retries === undefined ? 8 : args.retries, initialRetryTime: 200, maxRetryTime: 5000 },
  };
  if (args.ssl) {
    config.ssl = {
      ca: [fs.readFileSync(args.ssl.ca)],
      cert: fs.readFileSync(args.ssl.cert),
      key: fs.readFileSync(args.ssl.key),
    };
  }
  if (args.sasl) config.sasl = args.sasl;
  return new Kafka(config);
}

// Results are JSON: Buffers become strings (utf-8), everything else as KafkaJS returns it.
function plain(value) {
  if (value === undefined) return null;
  return JSON.parse(JSON.stringify(value, (_k, v) => (v && v.type === 'Buffer' && Array.isArray(v.data)
    ? Buffer.from(v.data).toString('utf8') : v)));
}

async function admin() {
  const client = kafka().admin();
  try {
    await client.connect();
  } catch (e) {
    out({ call: 'connect', error: describe(e) });
    return;
  }
  try {
    for (const [method, ...callArgs] of args.calls) {
      try {
        out({ call: method, ok: plain(await client[method](...callArgs)) });
      } catch (e) {
        out({ call: method, error: describe(e) });
      }
    }
  } finally {
    await client.disconnect();
  }
}

async function produce() {
  const producer = kafka().producer({
    idempotent: Boolean(args.idempotent),
    maxInFlightRequests: args.idempotent ? 1 : undefined,
    allowAutoTopicCreation: false,
  });
  await producer.connect();
  const compression = args.compression === 'gzip' ? CompressionTypes.GZIP : CompressionTypes.None;
  const batch = args.batch || 1;
  try {
    for (let first = 0; first < args.count; first += batch) {
      const numbers = [];
      for (let i = first; i < Math.min(first + batch, args.count); i++) numbers.push(i);
      const messages = numbers.map((i) => ({
        key: args.key ? `${args.key}${i}` : null,
        value: `${args.prefix || ''}${String(i).padStart(6, '0')}`,
        headers: args.headers ? { n: String(i), origin: 'kafkajs' } : undefined,
        timestamp: args.timestamp ? String(args.timestamp + i) : undefined,
        partition: args.partitions ? i % args.partitions : undefined,
      }));
      try {
        const answers = await producer.send({ topic: args.topic, acks: args.acks === undefined ? -1 : args.acks, compression, messages });
        // With the partitions chosen here, each partition's records follow its base offset in send order.
        const next = {};
        for (const a of answers) if (a.errorCode === 0) next[a.partition] = Number(a.baseOffset);
        if (args.partitions && numbers.every((i) => next[i % args.partitions] !== undefined)) {
          out({ acked: numbers.map((i) => [i, i % args.partitions, next[i % args.partitions]++]) });
        } else {
          out({ answers: plain(answers), numbers });
        }
      } catch (e) {
        out({ failed: numbers, error: describe(e) });
      }
      if (args.paceMs) await sleep(args.paceMs);
    }
  } finally {
    await producer.disconnect();
  }
  out({ done: true });
}

async function consume() {
  const consumer = kafka().consumer({
    groupId: args.group, allowAutoTopicCreation: false, readUncommitted: Boolean(args.readUncommitted),
  });
  await consumer.connect();
  await consumer.subscribe({ topic: args.topic, fromBeginning: true });
  const records = [];
  await consumer.run({
    autoCommitThreshold: 1,
    eachMessage: async ({ partition, message }) => {
      const headers = {};
      for (const [k, v] of Object.entries(message.headers || {})) headers[k] = v === null ? null : v.toString('utf8');
      records.push([partition, Number(message.offset), message.key === null ? null : message.key.toString('utf8'),
        message.value === null ? null : message.value.toString('utf8'), headers, Number(message.timestamp)]);
    },
  });
  const deadline = Date.now() + (args.timeoutMs || 60000);
  while (records.length < args.expected && Date.now() < deadline) await sleep(100);
  await consumer.disconnect(); // commits what eachMessage saw
  out({ records });
}

async function member() {
  const consumer = kafka().consumer({
    groupId: args.group,
    heartbeatInterval: args.heartbeatMs || 500,
    sessionTimeout: args.sessionMs || 10000,
    allowAutoTopicCreation: false,
  });
  consumer.on(consumer.events.GROUP_JOIN, (e) => out({ assigned: e.payload.memberAssignment }));
  let stopping = false;
  process.on('SIGTERM', async () => {
    if (stopping) return;
    stopping = true;
    await consumer.disconnect();
    out({ left: true });
    process.exit(0);
  });
  await consumer.connect();
  await consumer.subscribe({ topic: args.topic, fromBeginning: true });
  await consumer.run({
    autoCommitThreshold: 1,
    eachMessage: async ({ partition, message }) => out({ record: [partition, Number(message.offset), message.value.toString('utf8')] }),
  });
  out({ running: true });
}

async function transaction() {
  const producer = kafka().producer({ transactionalId: args.transactionalId, idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  try {
    for (const [name, outcome] of args.transactions) {
      const started = Date.now();
      const messages = [];
      for (let i = 0; i < args.count; i++) messages.push({ value: `${name}-${i}`, partition: i % args.partitions });
      try {
        const txn = await producer.transaction();
        // send() resolves once the records are written: an abort after it aborts records in the log.
        const answers = await txn.send({ topic: args.topic, messages });
        if (outcome === 'commit') await txn.commit(); else await txn.abort();
        // Each partition's records follow its base offset in send order.
        const next = {};
        for (const a of answers) if (a.errorCode === 0) next[a.partition] = Number(a.baseOffset);
        out({
          transaction: name,
          outcome,
          acked: messages.map((m, i) => [i, m.partition, next[m.partition] === undefined ? null : next[m.partition]++, m.value]),
        });
      } catch (e) {
        out({ transaction: name, error: describe(e), ms: Date.now() - started });
        return;
      }
    }
  } finally {
    await producer.disconnect();
  }
  out({ done: true });
}

const ops = { admin, produce, consume, member, transaction };
ops[args.op]().then(
  () => { if (args.op !== 'member') process.exit(0); },
  (e) => { out({ fatal: describe(e) }); process.exit(1); },
);
