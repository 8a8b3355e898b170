"""Publish one message through kubemq-proxy with pika and consume it.

    AMQP_URL=amqp://guest:guest@localhost:5672/ python3 amqp_pika.py

pika comes from Debian's python3-pika (apt-get install python3-pika).
"""
import os
import sys

import pika


def main():
    url = os.environ.get("AMQP_URL", "amqp://guest:guest@localhost:5672/")
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()  # basic_publish now waits for the broker's ack
    # A server-named exclusive queue: it goes away with the connection.
    queue = ch.queue_declare("", exclusive=True, auto_delete=True).method.queue

    ch.basic_publish("", queue, b"hello from Python AMQP",
                     pika.BasicProperties(content_type="text/plain"))
    print("published to", queue)

    for method, _props, body in ch.consume(queue, inactivity_timeout=60):
        if method is None:
            sys.exit("no message received within a minute")
        print("received", body.decode())
        ch.basic_ack(method.delivery_tag)
        break
    ch.cancel()
    conn.close()


if __name__ == "__main__":
    main()
