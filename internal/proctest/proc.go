package proctest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// StartTimeout bounds the wait for a started process's listeners.
const StartTimeout = 60 * time.Second

// problemLines is how many lines from the start of a race report, panic or
// fatal error are kept as a problem: enough for the stacks that locate it.
const problemLines = 40

// Proc is one running kubemq-proxy process (a proxy, or an embedded-mode
// backend). Its stderr goes to a log file; the "listening" lines give the
// bound addresses; race reports, panics and fatal errors are collected as
// problems.
type Proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed once the log is read to its end and the process has exited

	mu       sync.Mutex // guards addrs and problems, written by the log reader, and killed
	addrs    map[string]string
	problems []string
	killed   time.Time // when Kill sent SIGKILL
}

// Start runs the binary bin with args in dir, until every listener named
// in want has reported its address. dir should hold no config.yaml (the
// binary reads ./config.yaml), so that only args configure the process;
// the log goes to dir/<name>-<unix nanos>.log. A process that exits first,
// or does not report within StartTimeout (it is killed then), is an error
// that carries the end of its log.
func Start(bin, name, dir string, want []string, args ...string) (*Proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, fmt.Sprintf("%s-%d.log", name, time.Now().UnixNano()))
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &Proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{}), addrs: map[string]string{}}
	found := make(chan struct{})
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		defer logf.Close()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		signalled := false
		inProblem := 0 // lines still to keep of the current problem
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logf, line)
			if strings.Contains(line, "WARNING: DATA RACE") || strings.HasPrefix(line, "panic:") || strings.HasPrefix(line, "fatal error:") {
				inProblem = problemLines
			}
			if inProblem > 0 {
				inProblem--
				p.mu.Lock()
				p.problems = append(p.problems, line)
				p.mu.Unlock()
			}
			if listener, addr, ok := listening(line); ok {
				p.mu.Lock()
				p.addrs[listener] = addr
				ready := true
				for _, l := range want {
					ready = ready && p.addrs[l] != ""
				}
				p.mu.Unlock()
				if ready && !signalled {
					signalled = true
					close(found)
				}
			}
		}
	}()
	// Wait only once the log is read to its end: Wait closes the pipe.
	live.Store(p, struct{}{})
	go func() { <-scanned; cmd.Wait(); live.Delete(p); close(p.done) }()
	select {
	case <-found:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("%s exited before listening: %s", name, p.Tail(20))
	case <-time.After(StartTimeout):
		p.Kill()
		return nil, fmt.Errorf("%s did not report its listeners %v within %v: %s", name, want, StartTimeout, p.Tail(20))
	}
}

// listening parses one JSON log line of the binary; ok when it is a
// "listening" record, which names the listener and its bound address.
func listening(line string) (listener, addr string, ok bool) {
	var rec struct {
		Msg      string `json:"msg"`
		Listener string `json:"listener"`
		Address  string `json:"address"`
	}
	if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != "listening" {
		return "", "", false
	}
	return rec.Listener, rec.Address, true
}

// RSS returns the process's resident memory in bytes, from /proc (0 when it cannot be read).
func (p *Proc) RSS() float64 { return p.status("VmRSS:") }

// PeakRSS returns the process's highest resident memory so far in bytes (VmHWM).
func (p *Proc) PeakRSS() float64 { return p.status("VmHWM:") }

// CPU returns the processor time the process used so far, user and system, from
// /proc/PID/stat (0 when it cannot be read). Its resolution is the kernel's clock tick, taken
// as 100 per second (USER_HZ, the value on every Linux architecture Go supports).
func (p *Proc) CPU() time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) is in parentheses and may hold spaces: count from after it.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 13 { // f[0] is field 3 (state); utime and stime are fields 14 and 15
		return 0
	}
	user, err1 := strconv.ParseInt(f[11], 10, 64)
	sys, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(user+sys) * (time.Second / 100)
}

// status returns a memory field of /proc/PID/status in bytes (0 when it cannot be read).
func (p *Proc) status(field string) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb * 1024
		}
	}
	return 0
}

// Name is the name the process was started with.
func (p *Proc) Name() string { return p.name }

// LogPath is the file the process's stderr goes to.
func (p *Proc) LogPath() string { return p.logPath }

// Addr returns the bound address the listener reported ("" if none).
func (p *Proc) Addr(listener string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addrs[listener]
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process (e.g. SIGHUP for a reload).
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Kill sends SIGKILL and waits for the exit; it does nothing once the
// process has exited.
func (p *Proc) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.mu.Lock()
	p.killed = time.Now()
	p.mu.Unlock()
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// KilledAt is when Kill sent SIGKILL to the process (zero if it never did).
func (p *Proc) KilledAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.killed
}

// Stop sends SIGTERM and waits up to d for a graceful exit. A non-zero exit
// code is an error; so is no exit within d, after which the process is
// killed.
func (p *Proc) Stop(d time.Duration) error {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if code := p.cmd.ProcessState.ExitCode(); code != 0 {
			return fmt.Errorf("%s: exit code %d after SIGTERM", p.name, code)
		}
		return nil
	case <-time.After(d):
		p.Kill()
		return fmt.Errorf("%s: no exit %v after SIGTERM", p.name, d)
	}
}

// Exited reports whether the process has ended (on its own or stopped).
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Problems returns the race reports, panics and fatal errors the process
// printed, each as its first lines.
func (p *Proc) Problems() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.problems...)
}

// Warnings returns, after a newline, the first n lines of the process's log
// at level warn or above (zap's JSON or console encoding), for a failure
// message: the lines Tail's window may have scrolled past.
func (p *Proc) Warnings(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	var out [][]byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if len(out) == n {
			break
		}
		for _, lv := range [][]byte{[]byte(`"level":"warn"`), []byte(`"level":"error"`), []byte(`"level":"fatal"`), []byte("\tWARN\t"), []byte("\tERROR\t")} {
			if bytes.Contains(l, lv) {
				out = append(out, l)
				break
			}
		}
	}
	return "\n" + string(bytes.Join(out, []byte("\n")))
}

// Tail returns the last n lines of the process's log (all of it when n is
// 0 or less), after a newline, for a failure message.
func (p *Proc) Tail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if n > 0 && len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "\n" + string(bytes.Join(lines, []byte("\n")))
}
