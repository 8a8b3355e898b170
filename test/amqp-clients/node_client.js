// amqplib peer for the AMQP 0-9-1 front-end: node node_client.js <amqp-url>
// Exercises declare/bind/publish (confirms, mandatory returns)/get/consume
// with ack, nack and requeue, logging in with AMQPLAIN. Exits 0 and prints
// OK when everything behaved as RabbitMQ does.
'use strict';
const amqp = require('amqplib');
const assert = require('assert');

async function main(url) {
  const u = new URL(url);
  const conn = await amqp.connect(url, {
    credentials: amqp.credentials.amqplain(decodeURIComponent(u.username), decodeURIComponent(u.password)),
  });
  try {
    const ch = await conn.createConfirmChannel();
    await ch.assertExchange('node.x', 'topic', { durable: false });
    const q = (await ch.assertQueue('', { exclusive: true })).queue;
    assert.match(q, /^amq\.gen-/);
    await ch.bindQueue(q, 'node.x', 'node.#');

    const returned = new Promise((resolve) => ch.on('return', resolve));
    await new Promise((resolve, reject) =>
      ch.publish('node.x', 'node.a', Buffer.from('one'), { headers: { n: 1, s: 'x' }, contentType: 'text/plain' },
        (err) => (err ? reject(err) : resolve())));
    await new Promise((resolve, reject) =>
      ch.publish('node.x', 'elsewhere', Buffer.from('lost'), { mandatory: true }, (err) => (err ? reject(err) : resolve())));
    const r = await returned;
    assert.strictEqual(r.fields.replyCode, 312);
    assert.strictEqual(r.fields.replyText, 'NO_ROUTE');
    ch.sendToQueue(q, Buffer.from('two'));
    await ch.waitForConfirms();

    const m = await ch.get(q);
    assert.ok(m, 'get returned nothing');
    assert.strictEqual(m.content.toString(), 'one');
    assert.strictEqual(m.fields.exchange, 'node.x');
    assert.strictEqual(m.fields.routingKey, 'node.a');
    assert.strictEqual(m.fields.messageCount, 1);
    assert.strictEqual(m.properties.contentType, 'text/plain');
    assert.strictEqual(m.properties.headers.s, 'x');
    assert.strictEqual(Number(m.properties.headers.n), 1);
    ch.ack(m);

    // Consume: nack with requeue comes back redelivered, then ack.
    const seen = [];
    await new Promise((resolve) => {
      ch.consume(q, (d) => {
        seen.push([d.content.toString(), d.fields.redelivered]);
        if (!d.fields.redelivered) {
          ch.nack(d, false, true);
        } else {
          ch.ack(d);
          resolve();
        }
      });
    });
    assert.deepStrictEqual(seen, [['two', false], ['two', true]]);

    // A channel error: passive declare of a missing queue is 404.
    const ch2 = await conn.createChannel();
    ch2.on('error', () => {});
    await assert.rejects(ch2.checkQueue('node.missing'), /404/);
    await ch.close();
  } finally {
    await conn.close();
  }
  console.log('OK');
}

main(process.argv[2]).catch((err) => {
  console.error(err);
  process.exit(1);
});
