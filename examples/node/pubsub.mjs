// Publish one message through kubemq-proxy with the official Node Pub/Sub
// client and receive it:
//
//   PUBSUB_EMULATOR_HOST=localhost:8085 node pubsub.mjs
//
// With PUBSUB_EMULATOR_HOST set the client talks plaintext without
// credentials, exactly as with Google's emulator.
import { PubSub } from '@google-cloud/pubsub';

if (!process.env.PUBSUB_EMULATOR_HOST) {
  console.error('set PUBSUB_EMULATOR_HOST to the proxy\'s Pub/Sub address, e.g. localhost:8085');
  process.exit(1);
}
const pubsub = new PubSub({ projectId: process.env.PUBSUB_PROJECT_ID || 'example-project' });
const suffix = Date.now(); // fresh names on every run

const [topic] = await pubsub.createTopic(`example-topic-${suffix}`);
const [subscription] = await topic.createSubscription(`example-sub-${suffix}`);

const id = await topic.publishMessage({ data: Buffer.from('hello from Node Pub/Sub') });
console.log('published', id);

await new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error('no message received within a minute')), 60000);
  subscription.on('error', reject);
  subscription.on('message', (message) => {
    console.log('received', message.data.toString());
    message.ack();
    clearTimeout(timer);
    resolve();
  });
});
await subscription.close();
await pubsub.close();
