// Publish one message through kubemq-proxy with amqplib and consume it:
//
//   AMQP_URL=amqp://guest:guest@localhost:5672/ node amqp.mjs
import amqp from 'amqplib';

const conn = await amqp.connect(process.env.AMQP_URL || 'amqp://guest:guest@localhost:5672/');
const ch = await conn.createConfirmChannel();
// A server-named exclusive queue: it goes away with the connection.
const { queue } = await ch.assertQueue('', { exclusive: true, autoDelete: true });

ch.sendToQueue(queue, Buffer.from('hello from Node AMQP'), { contentType: 'text/plain' });
await ch.waitForConfirms();
console.log('published to', queue);

await new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error('no message received within a minute')), 60000);
  ch.consume(queue, (msg) => {
    console.log('received', msg.content.toString());
    ch.ack(msg);
    clearTimeout(timer);
    resolve();
  }).catch(reject);
});
await ch.close();
await conn.close();
