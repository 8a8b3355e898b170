package amqp091

import (
	"bufio"
	"net"
	"sync"
	"time"

	"github.com/kubemq-io/kubemq-proxy/amqp091/wire"
)

// outFrame is one command for the writer: a method, with content when
// props is set or body is not nil (content methods always carry a header).
type outFrame struct {
	channel uint16
	m       wire.Method
	props   *wire.Properties
	body    []byte
}

// writer is the only goroutine that writes to a connection. Everything
// else hands it commands through q; a command's frames are written
// contiguously, and the buffer is flushed whenever q runs empty, so a burst
// of deliveries costs one syscall. It sends heartbeats when nothing else
// was written for half the negotiated interval.
type writer struct {
	nc net.Conn
	bw *bufio.Writer
	fw *wire.FrameWriter

	q    chan outFrame
	stop chan struct{} // closed to ask the writer to finish
	done chan struct{} // closed when the writer has exited

	// Owned by the writer goroutine.
	lastWrite time.Time
	delivered bool // the last flush carried a delivery

	errMu sync.Mutex // guards err
	err   error
}

const writerQueue = 256

func newWriter(nc net.Conn, frameMax uint32) *writer {
	bw := bufio.NewWriterSize(nc, 32<<10)
	return &writer{
		nc: nc, bw: bw, fw: wire.NewFrameWriter(bw, frameMax),
		q: make(chan outFrame, writerQueue), stop: make(chan struct{}), done: make(chan struct{}),
	}
}

// send queues f; it returns false once the writer has stopped (the frame
// is dropped: the connection is going away).
func (w *writer) send(f outFrame) bool {
	select {
	case w.q <- f:
		return true
	case <-w.done:
		return false
	}
}

// method queues a content-less method on channel.
func (w *writer) method(channel uint16, m wire.Method) bool {
	return w.send(outFrame{channel: channel, m: m})
}

// finish asks the writer to write what is queued and exit, and waits at
// most timeout for it.
func (w *writer) finish(timeout time.Duration) {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-w.done:
	case <-t.C:
		// A peer that stopped reading: give up on the bytes still queued.
		w.nc.SetWriteDeadline(time.Now())
		<-w.done
	}
}

func (w *writer) setErr(err error) {
	w.errMu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.errMu.Unlock()
}

// Err returns the first write error.
func (w *writer) Err() error {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return w.err
}

// nudgeAfter is how long after a flush that carried a delivery the writer
// sends a heartbeat if nothing else was written meanwhile (see run).
const nudgeAfter = time.Millisecond

// run is the writer goroutine. heartbeat 0 disables heartbeats.
//
// With heartbeats on, a delivery that nothing follows within nudgeAfter
// is followed by a heartbeat frame. kombu's event loop (Celery's worker)
// reads a message, defers its ack to the loop's next turn and first sleeps
// in poll until its next timer (the worker's 2 s heartbeat, else up to
// 10 s) when no more bytes arrive; it reads the next message that way
// whenever the broker answers the previous ack before kombu is back in
// poll, which the proxy often does and RabbitMQ, slower, rarely. Any frame
// ends that sleep; a client acking within nudgeAfter never gets one.
func (w *writer) run(heartbeat time.Duration) {
	defer close(w.done)
	var tick <-chan time.Time
	var nudge *time.Timer
	var nudged <-chan time.Time
	if heartbeat > 0 {
		ticker := time.NewTicker(heartbeat / 2)
		defer ticker.Stop()
		tick = ticker.C
		nudge = time.NewTimer(time.Hour)
		nudge.Stop()
		defer nudge.Stop()
		nudged = nudge.C
	}
	w.lastWrite = time.Now()
	for {
		select {
		case f := <-w.q:
			if !w.write(f) || !w.drain() {
				return
			}
			if nudge != nil {
				if w.delivered {
					nudge.Reset(nudgeAfter)
				} else {
					nudge.Stop()
				}
			}
		case <-nudged:
			if err := w.fw.WriteHeartbeat(); err != nil {
				w.setErr(err)
				return
			}
			if !w.flush() {
				return
			}
			w.delivered = false
		case <-tick:
			if time.Since(w.lastWrite) >= heartbeat/2 {
				if err := w.fw.WriteHeartbeat(); err != nil {
					w.setErr(err)
					return
				}
				if !w.flush() {
					return
				}
			}
		case <-w.stop:
			// Write whatever is queued, then leave.
			for {
				select {
				case f := <-w.q:
					if !w.write(f) {
						return
					}
				default:
					w.flush()
					return
				}
			}
		}
	}
}

// drain writes every queued command, then flushes.
func (w *writer) drain() bool {
	for {
		select {
		case f := <-w.q:
			if !w.write(f) {
				return false
			}
		default:
			return w.flush()
		}
	}
}

func (w *writer) write(f outFrame) bool {
	var err error
	switch f.m.(type) {
	case *wire.BasicDeliver:
		w.delivered = true
	default:
		w.delivered = false
	}
	if f.m.HasContent() {
		err = w.fw.WriteContent(f.channel, f.m, f.props, f.body)
	} else {
		err = w.fw.WriteMethod(f.channel, f.m)
	}
	if err != nil {
		w.setErr(err)
		w.nc.Close() // unblock the reader: the connection is unusable
		return false
	}
	return true
}

func (w *writer) flush() bool {
	if w.bw.Buffered() == 0 {
		return true
	}
	if err := w.fw.Flush(); err != nil {
		w.setErr(err)
		w.nc.Close()
		return false
	}
	w.lastWrite = time.Now()
	return true
}
