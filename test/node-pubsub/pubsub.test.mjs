// The official Node client (@google-cloud/pubsub) against kubemq-proxy in
// emulator mode. PUBSUB_EMULATOR_HOST and PUBSUB_PROJECT_ID name the proxy
// and the project; TEST_SUFFIX keeps ids apart on a shared KubeMQ.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { PubSub, Schema, SchemaTypes, SchemaViews, Encodings } from '@google-cloud/pubsub';

const projectId = process.env.PUBSUB_PROJECT_ID || 'node-test';
const suffix = process.env.TEST_SUFFIX || String(Date.now());
const pubsub = new PubSub({ projectId });

// receive collects n messages from a subscription, acking each, and
// returns them in arrival order.
function receive(sub, n, { nackFirst = () => false } = {}) {
  return new Promise((resolve, reject) => {
    const got = [];
    const nacked = new Set();
    const timer = setTimeout(() => { sub.close(); reject(new Error(`received ${got.length} of ${n}`)); }, 30000);
    sub.on('error', (err) => { clearTimeout(timer); reject(err); });
    sub.on('message', (m) => {
      if (nackFirst(m) && !nacked.has(m.id)) {
        nacked.add(m.id);
        m.nack();
        return;
      }
      got.push(m);
      m.ack();
      if (got.length === n) {
        clearTimeout(timer);
        sub.close().then(() => resolve(got), reject);
      }
    });
  });
}

test('admin: create, get, list, duplicate is ALREADY_EXISTS', async () => {
  const [topic] = await pubsub.createTopic(`node-admin-${suffix}`);
  const [exists] = await topic.exists();
  assert.equal(exists, true);
  await assert.rejects(pubsub.createTopic(`node-admin-${suffix}`), (err) => err.code === 6);
  const [sub] = await topic.createSubscription(`node-admin-sub-${suffix}`, { ackDeadlineSeconds: 20 });
  const [meta] = await sub.getMetadata();
  assert.equal(meta.ackDeadlineSeconds, 20);
  const [topics] = await pubsub.getTopics();
  assert.ok(topics.some((t) => t.name.endsWith(`/topics/node-admin-${suffix}`)));
  await sub.delete();
  await topic.delete();
});

test('publish and subscribe with ack', async () => {
  const [topic] = await pubsub.createTopic(`node-pub-${suffix}`);
  const [sub] = await topic.createSubscription(`node-pub-sub-${suffix}`);
  const ids = [];
  for (let i = 0; i < 20; i++) {
    ids.push(await topic.publishMessage({ data: Buffer.from(`m${i}`), attributes: { i: String(i) } }));
  }
  const got = await receive(sub, 20);
  assert.deepEqual(new Set(got.map((m) => m.id)), new Set(ids));
  for (const m of got) {
    assert.equal(m.data.toString(), `m${m.attributes.i}`);
    assert.deepEqual(Object.keys(m.attributes), ['i']);
    assert.ok(m.publishTime instanceof Date);
  }
});

// receiveOrdered acks every delivery except the first of each message
// nackOnce picks, records each key's deliveries in arrival order, and
// resolves once every key has acked perKey distinct messages.
function receiveOrdered(sub, keys, perKey, nackOnce) {
  return new Promise((resolve, reject) => {
    const seqs = Object.fromEntries(keys.map((k) => [k, []]));
    const acked = Object.fromEntries(keys.map((k) => [k, new Set()]));
    const nacked = new Set();
    const timer = setTimeout(() => {
      sub.close();
      reject(new Error(`acked ${keys.map((k) => `${k}:${acked[k].size}`).join(' ')} of ${perKey} each`));
    }, 30000);
    sub.on('error', (err) => { clearTimeout(timer); reject(err); });
    sub.on('message', (m) => {
      const v = Number(m.data.toString());
      seqs[m.orderingKey].push(v);
      const id = `${m.orderingKey}/${v}`;
      if (nackOnce(v) && !nacked.has(id)) {
        nacked.add(id);
        m.nack();
        return;
      }
      m.ack();
      acked[m.orderingKey].add(v);
      if (keys.every((k) => acked[k].size === perKey)) {
        clearTimeout(timer);
        sub.close().then(() => resolve(seqs), reject);
      }
    });
  });
}

// A key's deliveries follow publish order and never skip a message; they
// go back only to a nacked message, from which the key's later messages
// come again in order (Google redelivers them, acked or not).
function assertKeyOrder(key, seq, perKey, nacked) {
  let max = -1;
  for (let j = 0; j < seq.length; j++) {
    const v = seq[j];
    assert.ok(v <= max + 1, `key ${key} skipped ahead to ${v}: ${seq}`);
    if (j > 0 && v <= seq[j - 1]) {
      assert.ok(nacked(v), `key ${key} went back to ${v}, which was not nacked: ${seq}`);
    }
    max = Math.max(max, v);
  }
  assert.equal(max, perKey - 1, `key ${key}: ${seq}`);
}

test('ordering keys: in order per key, also across a nack', async () => {
  const [topic] = await pubsub.createTopic(`node-order-${suffix}`);
  const [sub] = await topic.createSubscription(`node-order-sub-${suffix}`, { enableMessageOrdering: true });
  const ordered = pubsub.topic(topic.name, { messageOrdering: true });
  const perKey = 15;
  const keys = ['a', 'b'];
  for (const key of keys) {
    for (let i = 0; i < perKey; i++) {
      await ordered.publishMessage({ data: Buffer.from(String(i)), orderingKey: key });
    }
  }
  const nacked = (v) => v === 5;
  const seqs = await receiveOrdered(sub, keys, perKey, nacked);
  for (const key of keys) {
    assertKeyOrder(key, seqs[key], perKey, nacked);
  }
});

test('seek to a time: back to messages already acked, and purge', async () => {
  const [topic] = await pubsub.createTopic(`node-seek-${suffix}`);
  const [sub] = await topic.createSubscription(`node-seek-sub-${suffix}`);
  const before = new Date();
  for (let i = 0; i < 5; i++) {
    await topic.publishMessage({ data: Buffer.from(`m${i}`) });
  }
  const first = await receive(sub, 5);
  await sub.seek(before);
  const again = await receive(sub, 5);
  assert.deepEqual(new Set(again.map((m) => m.id)), new Set(first.map((m) => m.id)));
  // A time not in the past empties the subscription: only later messages come.
  for (let i = 5; i < 8; i++) {
    await topic.publishMessage({ data: Buffer.from(`m${i}`) });
  }
  await sub.seek(new Date(Date.now() + 1000));
  const after = await topic.publishMessage({ data: Buffer.from('last') });
  const got = await receive(sub, 1);
  assert.equal(got[0].id, after);
});

const avroState = JSON.stringify({
  type: 'record', name: 'State', namespace: 'utilities',
  fields: [{ name: 'name', type: 'string' }, { name: 'post_abbr', type: 'string' }],
});
const avroStateV2 = JSON.stringify({
  type: 'record', name: 'State', namespace: 'utilities',
  fields: [{ name: 'name', type: 'string' }, { name: 'post_abbr', type: 'string' },
    { name: 'capital', type: ['null', 'string'], default: null }],
});

test('schemas: create, get, list, validate, revisions, delete', async () => {
  const id = `node-schema-${suffix}`;
  const schema = await pubsub.createSchema(id, SchemaTypes.Avro, avroState);
  const full = await schema.get();
  assert.equal(full.name, await schema.getName());
  assert.equal(full.type, 'AVRO');
  assert.equal(full.definition, avroState);
  assert.match(full.revisionId, /^[0-9a-f]{8}$/);
  const basic = await schema.get(SchemaViews.Basic);
  assert.equal(basic.definition, '');
  await assert.rejects(pubsub.createSchema(id, SchemaTypes.Avro, avroState), (err) => err.code === 6);
  await assert.rejects(pubsub.createSchema(`node-bad-${suffix}`, SchemaTypes.Avro, '{"type":"record"}'),
    (err) => err.code === 3 && /Could not parse schema definition/.test(err.details));

  const names = [];
  for await (const s of pubsub.listSchemas(SchemaViews.Basic)) {
    names.push(s.name);
  }
  assert.ok(names.includes(full.name), `${names} lacks ${full.name}`);

  await pubsub.validateSchema({ type: SchemaTypes.Avro, definition: avroState });
  await assert.rejects(pubsub.validateSchema({ type: SchemaTypes.Avro, definition: 'nope' }), (err) => err.code === 3);
  // A string message would be read as base64 (a bytes field): pass a Buffer.
  await schema.validateMessage(Buffer.from(JSON.stringify({ name: 'Alaska', post_abbr: 'AK' })), Encodings.Json);
  await assert.rejects(schema.validateMessage(Buffer.from(JSON.stringify({ name: 'Alaska' })), Encodings.Json),
    (err) => err.code === 3 && /Could not parse JSON Avro message/.test(err.details));

  // Revisions through the generated client.
  const client = await pubsub.getSchemaClient();
  const [v2] = await client.commitSchema({ name: full.name, schema: { type: 'AVRO', definition: avroStateV2 } });
  assert.notEqual(v2.revisionId, full.revisionId);
  const [back] = await client.rollbackSchema({ name: full.name, revisionId: full.revisionId });
  assert.equal(back.definition, avroState);
  const [revs] = await client.listSchemaRevisions({ name: full.name });
  assert.deepEqual(revs.map((r) => r.revisionId), [back.revisionId, v2.revisionId, full.revisionId]);
  const [deleted] = await client.deleteSchemaRevision({ name: `${full.name}@${v2.revisionId}` });
  assert.equal(deleted.revisionId, v2.revisionId);
  await assert.rejects(client.getSchema({ name: `${full.name}@${v2.revisionId}` }), (err) => err.code === 5);

  await schema.delete();
  await assert.rejects(schema.get(), (err) => err.code === 5);
});

test('schemas: a topic refuses non-conforming data; messages carry the schema attributes', async () => {
  const id = `node-topic-schema-${suffix}`;
  const schema = await pubsub.createSchema(id, SchemaTypes.Avro, avroState);
  const schemaName = await schema.getName();
  const [topic] = await pubsub.createTopic({
    name: `node-schema-topic-${suffix}`,
    schemaSettings: { schema: schemaName, encoding: Encodings.Json },
  });
  const [meta] = await topic.getMetadata();
  assert.equal(meta.schemaSettings.schema, schemaName);
  assert.equal(meta.schemaSettings.encoding, 'JSON');
  const [sub] = await topic.createSubscription(`node-schema-sub-${suffix}`);
  await assert.rejects(topic.publishMessage({ data: Buffer.from('{"name":"Alaska"}') }), (err) => {
    return err.code === 3 && /Message failed schema validation/.test(err.message);
  });
  const good = await topic.publishMessage({ json: { name: 'Alaska', post_abbr: 'AK' } });
  const [got] = await receive(sub, 1);
  assert.equal(got.id, good);
  const sm = Schema.metadataFromMessage(got.attributes);
  const full = await schema.get();
  assert.deepEqual(sm, { name: schemaName, revision: full.revisionId, encoding: 'JSON' });

  await schema.delete();
  const [after] = await topic.getMetadata();
  assert.equal(after.schemaSettings.schema, '_deleted-schema_');
  await assert.rejects(topic.publishMessage({ json: { name: 'Alaska', post_abbr: 'AK' } }), (err) => err.code === 5);
});

test('snapshots: create, list, seek back to the unacked state, delete', async () => {
  const [topic] = await pubsub.createTopic(`node-snap-${suffix}`);
  const [sub] = await topic.createSubscription(`node-snap-sub-${suffix}`);
  const ids = [];
  for (let i = 0; i < 4; i++) {
    ids.push(await topic.publishMessage({ data: Buffer.from(`s${i}`) }));
  }
  const [snapshot] = await sub.createSnapshot(`node-snap-s-${suffix}`);
  assert.ok(snapshot.name.endsWith(`/snapshots/node-snap-s-${suffix}`));
  const [snaps] = await pubsub.getSnapshots();
  assert.ok(snaps.some((s) => s.name === snapshot.name));
  ids.push(await topic.publishMessage({ data: Buffer.from('after') }));
  const first = await receive(sub, 5);
  assert.deepEqual(new Set(first.map((m) => m.id)), new Set(ids));
  await sub.seek(snapshot.name);
  const again = await receive(sub, 5);
  assert.deepEqual(new Set(again.map((m) => m.id)), new Set(ids));
  await snapshot.delete();
  await assert.rejects(sub.seek(snapshot.name), (err) => err.code === 5);
});

test('exactly-once: ackWithResponse succeeds, and reports INVALID for a stale ack id', async () => {
  const [topic] = await pubsub.createTopic(`node-eod-${suffix}`);
  const [sub] = await topic.createSubscription(`node-eod-sub-${suffix}`, { enableExactlyOnceDelivery: true });
  await topic.publishMessage({ data: Buffer.from('one') });
  await topic.publishMessage({ data: Buffer.from('two') });
  const held = await new Promise((resolve, reject) => {
    const got = [];
    const timer = setTimeout(() => reject(new Error(`received ${got.length} of 2`)), 30000);
    sub.on('error', reject);
    sub.on('message', (m) => {
      got.push(m);
      if (got.length === 2) {
        clearTimeout(timer);
        resolve(got);
      }
    });
  });
  assert.equal(await held[0].ackWithResponse(), 'SUCCESS');
  // A seek makes the other message's ack id stale.
  await sub.seek(new Date(Date.now() + 1000));
  await assert.rejects(held[1].ackWithResponse(), (err) => err.errorCode === 'INVALID');
  await sub.close();
});
