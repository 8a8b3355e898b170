"""pika peer: python3 pika_forced.py refused|forced <amqp-url>

refused: the broker refuses the connection (kubemq-proxy with KubeMQ unreachable); pika must
report it as 320 CONNECTION_FORCED (ConnectionClosedByBroker), not as a failed login or an
access refusal. forced: the connection opens and a channel with it; after printing READY the
broker closes the connection with 320 (the test provokes it), which pika must report as such.
Prints OK and exits 0 when it did.
"""
import sys

import pika


def check(e):
    assert isinstance(e, pika.exceptions.ConnectionClosedByBroker), repr(e)
    assert e.reply_code == 320, repr(e)
    assert e.reply_text.startswith("CONNECTION_FORCED - "), repr(e)


def main(mode, url):
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        conn.channel()
        if mode == "forced":
            print("READY", flush=True)
            conn.process_data_events(time_limit=20)
        raise AssertionError("the connection was not closed")
    except (pika.exceptions.ProbableAuthenticationError, pika.exceptions.ProbableAccessDeniedError) as e:
        raise AssertionError("reported as a login or access refusal: %r" % e)
    except pika.exceptions.ConnectionClosedByBroker as e:
        check(e)
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
