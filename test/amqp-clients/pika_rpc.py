"""pika peer for direct reply-to: python3 pika_rpc.py <amqp-url>

The RPC pattern of RabbitMQ's direct reply-to guide: a client consumes
amq.rabbitmq.reply-to (auto-ack) and publishes requests with that reply_to;
a server on another connection consumes the request queue and answers to
the rewritten reply_to through the default exchange. Also checks the
refusal of a publish with reply_to before consuming. Prints OK and exits 0
when everything behaved as RabbitMQ does.
"""
import sys

import pika


def main(url):
    server_conn = pika.BlockingConnection(pika.URLParameters(url))
    server = server_conn.channel()
    server.queue_declare("py.rpc", auto_delete=True)

    def on_request(ch, method, props, body):
        assert props.reply_to.startswith("amq.rabbitmq.reply-to."), props.reply_to
        ch.basic_publish("", props.reply_to, body.upper(),
                         pika.BasicProperties(correlation_id=props.correlation_id))
        ch.basic_ack(method.delivery_tag)

    server.basic_consume("py.rpc", on_request)

    client_conn = pika.BlockingConnection(pika.URLParameters(url))
    client = client_conn.channel()
    replies = []
    client.basic_consume("amq.rabbitmq.reply-to",
                         lambda ch, m, p, b: replies.append((p.correlation_id, b)),
                         auto_ack=True)
    for i in range(5):
        client.basic_publish("", "py.rpc", b"req%d" % i,
                             pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id=str(i)))
    for _ in range(200):
        server_conn.process_data_events(time_limit=0.05)
        client_conn.process_data_events(time_limit=0.05)
        if len(replies) == 5:
            break
    assert replies == [(str(i), b"REQ%d" % i) for i in range(5)], replies

    other = client_conn.channel()
    try:
        other.basic_publish("", "py.rpc", b"x", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
        other.queue_declare("py.after", auto_delete=True)
        raise AssertionError("publish with reply_to before consuming was accepted")
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 406 and e.reply_text == "PRECONDITION_FAILED - fast reply consumer does not exist", e

    client_conn.close()
    server_conn.close()
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1])
