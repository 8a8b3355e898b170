// amqplib peer: node node_close.js <amqp-url>
// A connection closed while its publishes are still being written must get
// close-ok (amqplib writes connection.close ahead of channel frames it still
// has queued), and every publish that was confirmed must be stored. Prints
// OK and exits 0 when five such closes behaved as RabbitMQ does.
'use strict';
const amqp = require('amqplib');
const assert = require('assert');

async function main(url) {
  const q = 'node.close';
  for (let round = 0; round < 5; round++) {
    const conn = await amqp.connect(url);
    conn.on('error', () => {});
    const ch = await conn.createConfirmChannel();
    ch.on('error', () => {});
    await ch.assertQueue(q, { durable: false });
    await ch.purgeQueue(q);
    let acked = 0;
    const body = Buffer.alloc(1000, 'x');
    for (let i = 0; i < 2000; i++) {
      ch.sendToQueue(q, body, {}, (err) => { if (!err) acked++; });
    }
    const hung = setTimeout(() => {
      console.error(`round ${round}: connection.close got no close-ok within 10 s`);
      process.exit(1);
    }, 10000);
    await conn.close();
    clearTimeout(hung);

    const check = await amqp.connect(url);
    const cch = await check.createChannel();
    const { messageCount } = await cch.checkQueue(q);
    assert.ok(messageCount >= acked, `round ${round}: ${acked} confirmed but ${messageCount} stored`);
    await check.close();
  }
  console.log('OK');
}

main(process.argv[2]).catch((err) => {
  console.error(err);
  process.exit(1);
});
