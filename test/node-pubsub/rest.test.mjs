// The official Node client (@google-cloud/pubsub) over REST (google-gax's
// fallback: 'rest' transport: JSON over HTTP/1.1, the google.api.http
// mappings) against kubemq-proxy's REST API on its gRPC port.
// PUBSUB_REST_ENDPOINT (host:port), PUBSUB_PROJECT_ID and TEST_SUFFIX come
// from gcp's TestNodeClientREST. The streaming subscriber has no REST form;
// messages are pulled with the generated SubscriberClient.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { PubSub, v1, SchemaTypes } from '@google-cloud/pubsub';

const endpoint = process.env.PUBSUB_REST_ENDPOINT || '127.0.0.1:8085';
const [host, port] = endpoint.split(':');
const projectId = process.env.PUBSUB_PROJECT_ID || 'node-rest';
const suffix = process.env.TEST_SUFFIX || String(Date.now());

// A stand-in for Google credentials: the transport calls fetch on its
// auth client, which adds the bearer token.
const authClient = {
  universeDomain: 'googleapis.com',
  getRequestHeaders: async () => new Headers({ authorization: 'Bearer dummy' }),
  fetch: (url, r) => {
    const headers = new Headers(r.headers);
    headers.set('authorization', 'Bearer dummy');
    return fetch(url, { method: r.method, headers, body: r.body, signal: r.signal });
  },
};
const opts = { projectId, apiEndpoint: endpoint, servicePath: host, port: Number(port), fallback: 'rest', protocol: 'http', authClient };
const pubsub = new PubSub(opts);
const subscriber = new v1.SubscriberClient(opts);

async function pullN(subName, n) {
  const got = [];
  for (let i = 0; i < 50 && got.length < n; i++) {
    const [resp] = await subscriber.pull({ subscription: subName, maxMessages: n - got.length });
    got.push(...(resp.receivedMessages || []));
  }
  assert.equal(got.length, n, `pulled ${got.length} of ${n}`);
  return got;
}

test('admin over REST: create, get, list, errors as gRPC codes', async () => {
  const [topic] = await pubsub.createTopic(`nrest-admin-${suffix}`);
  await assert.rejects(pubsub.createTopic(`nrest-admin-${suffix}`), (err) => err.code === 6);
  await assert.rejects(pubsub.topic(`nrest-none-${suffix}`).getMetadata(), (err) => err.code === 5 && /Resource not found/.test(err.message));
  const [sub] = await topic.createSubscription(`nrest-admin-sub-${suffix}`, { ackDeadlineSeconds: 20 });
  const [meta] = await sub.getMetadata();
  assert.equal(meta.ackDeadlineSeconds, 20);
  assert.equal(meta.state, 'ACTIVE'); // an enum sent as a number (enum-encoding=int)
  const [topics] = await pubsub.getTopics();
  assert.ok(topics.some((t) => t.name.endsWith(`/topics/nrest-admin-${suffix}`)));
  const [subs] = await topic.getSubscriptions();
  assert.equal(subs.length, 1);
  await sub.delete();
  await topic.delete();
  const [exists] = await topic.exists();
  assert.equal(exists, false);
});

test('publish, pull, modifyAckDeadline, acknowledge over REST', async () => {
  const [topic] = await pubsub.createTopic(`nrest-pub-${suffix}`);
  const [sub] = await topic.createSubscription(`nrest-pub-sub-${suffix}`);
  const ids = [];
  for (let i = 0; i < 5; i++) {
    ids.push(await topic.publishMessage({ data: Buffer.from(`m${i}`), attributes: { i: String(i) } }));
  }
  const got = await pullN(sub.name, 5);
  assert.deepEqual(new Set(got.map((m) => m.message.messageId)), new Set(ids));
  for (const m of got) {
    assert.equal(Buffer.from(m.message.data).toString(), `m${m.message.attributes.i}`);
  }
  // Give one back at once: it comes again.
  await subscriber.modifyAckDeadline({ subscription: sub.name, ackIds: [got[0].ackId], ackDeadlineSeconds: 0 });
  const again = await pullN(sub.name, 1);
  assert.equal(again[0].message.messageId, got[0].message.messageId);
  await subscriber.acknowledge({ subscription: sub.name, ackIds: [...got.slice(1).map((m) => m.ackId), again[0].ackId] });
  const [empty] = await subscriber.pull({ subscription: sub.name, maxMessages: 5, returnImmediately: true });
  assert.equal((empty.receivedMessages || []).length, 0);
  await sub.delete();
  await topic.delete();
});

test('IAM and schemas over REST', async () => {
  const [topic] = await pubsub.createTopic(`nrest-iam-${suffix}`);
  const [set] = await topic.iam.setPolicy({ bindings: [{ role: 'roles/pubsub.publisher', members: ['user:a@example.com'] }] });
  assert.equal(set.bindings[0].role, 'roles/pubsub.publisher');
  const [policy] = await topic.iam.getPolicy();
  assert.deepEqual(policy.bindings[0].members, ['user:a@example.com']);
  const [perms] = await topic.iam.testPermissions(['pubsub.topics.publish']);
  assert.equal(perms['pubsub.topics.publish'], true);
  const def = JSON.stringify({ type: 'record', name: 'R', fields: [{ name: 'a', type: 'string' }] });
  const schema = await pubsub.createSchema(`nrest-sch-${suffix}`, SchemaTypes.Avro, def);
  const got = await schema.get();
  assert.equal(got.definition, def);
  await schema.delete();
  await topic.delete();
});
