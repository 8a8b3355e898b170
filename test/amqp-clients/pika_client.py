"""pika peer for the AMQP 0-9-1 front-end: python3 pika_client.py <amqp-url>

Exercises declare/bind/publish (confirms, mandatory returns)/get/consume with
ack, nack and requeue. Prints OK and exits 0 when everything behaved as
RabbitMQ does.
"""
import sys

import pika


def main(url):
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("py.x", exchange_type="direct")
    q = ch.queue_declare("", exclusive=True).method.queue
    assert q.startswith("amq.gen-"), q
    ch.queue_bind(q, "py.x", routing_key="k")

    props = pika.BasicProperties(content_type="text/plain", headers={"n": 1, "s": "x"}, delivery_mode=2)
    ch.basic_publish("py.x", "k", b"one", props)
    try:
        ch.basic_publish("py.x", "nowhere", b"lost", mandatory=True)
        raise AssertionError("unroutable mandatory publish was not returned")
    except pika.exceptions.UnroutableError as e:
        assert e.messages[0].method.reply_code == 312, e.messages[0].method
    ch.basic_publish("", q, b"two")

    method, header, body = ch.basic_get(q)
    assert body == b"one", body
    assert method.exchange == "py.x" and method.routing_key == "k", method
    assert method.message_count == 1, method
    assert header.content_type == "text/plain" and header.delivery_mode == 2, header
    assert header.headers == {"n": 1, "s": "x"}, header.headers
    ch.basic_ack(method.delivery_tag)

    seen = []
    for method, header, body in ch.consume(q, inactivity_timeout=10):
        assert method is not None, "no delivery"
        seen.append((body, method.redelivered))
        if not method.redelivered:
            ch.basic_nack(method.delivery_tag, requeue=True)
        else:
            ch.basic_ack(method.delivery_tag)
            break
    ch.cancel()
    assert seen == [(b"two", False), (b"two", True)], seen

    ch2 = conn.channel()
    try:
        ch2.queue_declare("py.missing", passive=True)
        raise AssertionError("passive declare of a missing queue succeeded")
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 404, e
    conn.close()
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1])
