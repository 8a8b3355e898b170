package gcp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// One port serves gRPC and the REST API. gRPC clients open with the
// HTTP/2 connection preface ("PRI * HTTP/2.0..."); REST clients speak
// HTTP/1.1, whose first line starts with a method name. A splitter reads the
// first bytes of each accepted connection, replays them, and hands the
// connection to gRPC's own transport or to the REST http.Server. The gRPC
// connection keeps grpc-go's native HTTP/2 transport (not grpc.Server's
// slower ServeHTTP); all it gains is one wrapper around the net.Conn that
// serves the sniffed bytes first.

// h2Preface is the start of the HTTP/2 client connection preface; no HTTP/1
// method is spelled "PRI", so four bytes decide.
var h2Preface = []byte("PRI ")

// sniffTimeout bounds how long a new connection may stay silent before it
// is closed; clients of both kinds write at once.
const sniffTimeout = 20 * time.Second

// splitter accepts on one listener and feeds two virtual listeners.
// Owner of its fields: mu guards closed and conns (connections being sniffed).
type splitter struct {
	lis  net.Listener
	log  *zap.Logger
	h2   *chanListener // HTTP/2 with prior knowledge: gRPC
	http *chanListener // everything else: REST over HTTP/1.1

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup // the accept loop and the sniffing goroutines
}

func newSplitter(lis net.Listener, log *zap.Logger) *splitter {
	return &splitter{lis: lis, log: log, h2: newChanListener(lis.Addr()), http: newChanListener(lis.Addr()),
		conns: map[net.Conn]struct{}{}}
}

// run accepts until the listener is closed; it returns the accept error
// that ended it (nil after close).
func (s *splitter) run() error {
	s.wg.Add(1)
	defer s.wg.Done()
	var backoff time.Duration
	for {
		c, err := s.lis.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				// Out of file descriptors and the like: wait as net/http does.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("gcp: accept failed; retrying", zap.Error(err), zap.Duration("in", backoff))
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.sniff(c)
	}
}

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// sniff reads until the first bytes tell HTTP/2 from HTTP/1 and hands the
// connection on.
func (s *splitter) sniff(c net.Conn) {
	defer s.wg.Done()
	var buf [len("PRI ")]byte
	n := 0
	_ = c.SetReadDeadline(time.Now().Add(sniffTimeout))
	h2 := true
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if !bytes.Equal(buf[:n], h2Preface[:n]) {
			h2 = false
			break
		}
		if err != nil {
			if n > 0 || !errors.Is(err, io.EOF) {
				s.log.Debug("gcp: connection closed before its first request", zap.Stringer("remote", c.RemoteAddr()), zap.Error(err))
			}
			s.forget(c)
			c.Close()
			return
		}
	}
	_ = c.SetReadDeadline(time.Time{})
	pc := &prefixConn{Conn: c, prefix: append([]byte(nil), buf[:n]...)}
	to := s.http
	if h2 {
		to = s.h2
		setGRPCSocketOptions(c)
	}
	s.forget(c)
	if !to.deliver(pc) {
		c.Close()
	}
}

func (s *splitter) forget(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// close stops accepting, closes the connections still being sniffed and
// waits for the splitter's goroutines. The virtual listeners are closed by
// their servers (grpc.Server.Stop, http.Server.Shutdown) or here.
func (s *splitter) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return
	}
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.lis.Close()
	s.wg.Wait()
	s.h2.Close()
	s.http.Close()
}

// prefixConn serves the sniffed bytes before reading on.
type prefixConn struct {
	net.Conn
	prefix []byte // owned by the reader of the connection
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// chanListener is a net.Listener fed by the splitter.
type chanListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newChanListener(addr net.Addr) *chanListener {
	return &chanListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

// deliver hands c to the listener's server; false once the listener is closed.
func (l *chanListener) deliver(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }

// serveSplit serves gRPC and REST on lis (Serve with REST on).
func (s *Server) serveSplit(lis net.Listener) error {
	sp := newSplitter(lis, s.log)
	hs := s.newRESTServer(s.rest)
	s.restMu.Lock()
	if s.restClosed {
		s.restMu.Unlock()
		lis.Close()
		return nil
	}
	s.splitters = append(s.splitters, sp)
	s.restServers = append(s.restServers, hs)
	s.restMu.Unlock()
	var wg sync.WaitGroup
	var grpcErr, httpErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		grpcErr = s.grpc.Serve(sp.h2)
	}()
	go func() {
		defer wg.Done()
		httpErr = hs.Serve(sp.http)
	}()
	err := sp.run()
	sp.close()
	wg.Wait()
	s.restMu.Lock()
	closed := s.restClosed
	s.restMu.Unlock()
	if closed {
		return nil
	}
	if err == nil {
		// The listener was closed under the server: report what the
		// servers saw, as grpc.Serve alone would.
		if grpcErr != nil && !errors.Is(grpcErr, grpc.ErrServerStopped) && !errors.Is(grpcErr, net.ErrClosed) {
			err = grpcErr
		} else if httpErr != nil && !errors.Is(httpErr, http.ErrServerClosed) && !errors.Is(httpErr, net.ErrClosed) {
			err = httpErr
		}
	}
	return err
}

// stopAccepting closes the listeners of serveSplit; the connections
// already handed on stay with their servers.
func (s *Server) stopAccepting() {
	s.restMu.Lock()
	s.restClosed = true
	sps := s.splitters
	s.restMu.Unlock()
	for _, sp := range sps {
		sp.close()
	}
}

// stopREST ends the REST servers: gracefully (requests in flight finish)
// until ctx ends, then at once.
func (s *Server) stopREST(ctx context.Context) {
	s.restMu.Lock()
	hss := s.restServers
	s.restMu.Unlock()
	for _, hs := range hss {
		if err := hs.Shutdown(ctx); err != nil {
			hs.Close()
		}
	}
}
