// amqplib peer: node node_forced.js refused|forced <amqp-url>
// refused: the broker refuses the connection (kubemq-proxy with KubeMQ unreachable); amqplib
// must report a close with 320 CONNECTION_FORCED. forced: the connection and a channel open;
// after printing READY the broker closes the connection with 320 (the test provokes it).
// Prints OK and exits 0 when amqplib reported it as such.
'use strict';
const amqp = require('amqplib');
const assert = require('assert');

async function main(mode, url) {
  const conn = await amqp.connect(url);
  const closed = new Promise((resolve) => conn.on('close', resolve));
  conn.on('error', () => {});
  const ch = await conn.createChannel().catch(() => null);
  if (mode === 'forced') {
    assert.ok(ch, 'channel did not open');
    console.log('READY');
  }
  const timer = setTimeout(() => { console.error('no close within 20 s'); process.exit(1); }, 20000);
  const err = await closed;
  clearTimeout(timer);
  assert.ok(err, 'closed without an error');
  assert.strictEqual(err.code, 320, err.message);
  assert.match(err.message, /CONNECTION_FORCED - /);
  console.log('OK');
  process.exit(0);
}

main(process.argv[2], process.argv[3]).catch((err) => {
  console.error(err);
  process.exit(1);
});
