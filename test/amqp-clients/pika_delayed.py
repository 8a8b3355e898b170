"""pika peer for the x-delayed-message exchange: python3 pika_delayed.py <amqp-url>

Declares a delayed exchange (x-delayed-type direct), checks the refusal of
one without x-delayed-type, publishes a message with x-delay 300 and one
without, and expects the undelayed one first and the delayed one after at
least 300 ms with x-delay -300. Prints OK and exits 0 on success.
"""
import sys
import time

import pika


def main(url):
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    try:
        ch.exchange_declare("py.bad", exchange_type="x-delayed-message")
        raise SystemExit("declare without x-delayed-type accepted")
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 406, e
        assert "'x-delayed-type' must be an existing exchange type" in e.reply_text, e
    ch = conn.channel()
    ch.exchange_declare("py.delayed", exchange_type="x-delayed-message",
                        arguments={"x-delayed-type": "direct"})
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "py.delayed", routing_key="k")
    start = time.monotonic()
    ch.basic_publish("py.delayed", "k", b"later", pika.BasicProperties(headers={"x-delay": 300}))
    ch.basic_publish("py.delayed", "k", b"now")
    got = []

    def on_message(c, m, p, body):
        got.append((body, (p.headers or {}).get("x-delay"), time.monotonic() - start))

    ch.basic_consume(q, on_message, auto_ack=True)
    for _ in range(200):
        conn.process_data_events(time_limit=0.05)
        if len(got) == 2:
            break
    assert [g[0] for g in got] == [b"now", b"later"], got
    assert got[1][1] == -300, got
    assert got[1][2] >= 0.3, got
    conn.close()
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1])
