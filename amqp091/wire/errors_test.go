package wire

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestErrorConstructors(t *testing.T) {
	constructors := map[uint16]func(string, ...any) *Error{
		311: ContentTooLarge, 312: NoRoute, 313: NoConsumers, 320: ConnectionForced,
		402: InvalidPath, 403: AccessRefused, 404: NotFound, 405: ResourceLocked,
		406: PreconditionFailed, 501: FrameError, 502: SyntaxError, 503: CommandInvalid,
		504: ChannelError, 505: UnexpectedFrame, 506: ResourceError, 530: NotAllowed,
		540: NotImplemented, 541: InternalError,
	}
	if len(constructors) != len(errorCodes) {
		t.Fatalf("%d constructors for %d spec error codes", len(constructors), len(errorCodes))
	}
	hard := map[uint16]bool{320: true, 402: true, 501: true, 502: true, 503: true, 504: true,
		505: true, 506: true, 530: true, 540: true, 541: true}
	for _, code := range errorCodes {
		ctor, ok := constructors[code]
		if !ok {
			t.Errorf("no constructor for %d %s", code, ReplyName(code))
			continue
		}
		e := ctor("detail %d", 7)
		if e.Code != code || e.Hard != hard[code] || IsHardError(code) != hard[code] {
			t.Errorf("%d: %+v", code, e)
		}
		if want := ReplyName(code) + " - detail 7"; e.Text != want {
			t.Errorf("%d: text %q, want %q", code, e.Text, want)
		}
		if bare := ctor(""); bare.Text != ReplyName(code) {
			t.Errorf("%d: bare text %q", code, bare.Text)
		}
	}
	if ReplyName(ReplySuccess) != "REPLY_SUCCESS" || IsHardError(ReplySuccess) {
		t.Error("200")
	}
	if ReplyName(999) != "" || !IsHardError(999) {
		t.Error("unknown codes should have no name and be hard")
	}
	if e := NewError(999, "x"); e.Text != "999 - x" || !e.Hard {
		t.Errorf("NewError(999) = %+v", e)
	}
}

// Texts mirror RabbitMQ 3.10's (amqp091/errors_test.go checks them against a RabbitMQ node).
func TestErrorTextsMatchRabbitMQ(t *testing.T) {
	for _, c := range []struct {
		err  *Error
		want string
	}{
		{NotFound("no queue '%s' in vhost '%s'", "probe.missing", "/"), "NOT_FOUND - no queue 'probe.missing' in vhost '/'"},
		{CommandInvalid("unknown exchange type '%s'", "x-bogus"), "COMMAND_INVALID - unknown exchange type 'x-bogus'"},
		{PreconditionFailed("unknown delivery tag %d", 999), "PRECONDITION_FAILED - unknown delivery tag 999"},
		{NotImplemented("prefetch_size!=0 (%d)", 1024), "NOT_IMPLEMENTED - prefetch_size!=0 (1024)"},
		{NotAllowed("attempt to reuse consumer tag '%s'", "same"), "NOT_ALLOWED - attempt to reuse consumer tag 'same'"},
		{NoRoute(""), "NO_ROUTE"},
	} {
		if c.err.Text != c.want {
			t.Errorf("got %q, want %q", c.err.Text, c.want)
		}
	}
}

func TestErrorCloseMethod(t *testing.T) {
	soft := NotFound("no queue 'q'").OnMethod(ClassQueue, MethodQueueDeclare)
	cm, ok := soft.CloseMethod().(*ChannelClose)
	if !ok || *cm != (ChannelClose{ReplyCode: 404, ReplyText: "NOT_FOUND - no queue 'q'", FailingClassID: 50, FailingMethodID: 10}) {
		t.Fatalf("soft close = %#v", soft.CloseMethod())
	}
	hard := FrameError("bad")
	if _, ok := hard.CloseMethod().(*ConnectionClose); !ok {
		t.Fatalf("hard close = %#v", hard.CloseMethod())
	}
	// A login failure: soft code, escalated.
	login := AccessRefused("Login was refused using authentication mechanism PLAIN. For details see the broker logfile.")
	login.Hard = true
	if cc, ok := login.CloseMethod().(*ConnectionClose); !ok || cc.ReplyCode != 403 {
		t.Fatalf("login close = %#v", login.CloseMethod())
	}

	if got := soft.Error(); got != "amqp channel error 404 (on queue.declare): NOT_FOUND - no queue 'q'" {
		t.Errorf("Error() = %q", got)
	}
	if got := hard.Error(); got != "amqp connection error 501: FRAME_ERROR - bad" {
		t.Errorf("Error() = %q", got)
	}
	var target *Error
	if !errors.As(fmt.Errorf("wrapped: %w", soft), &target) || target != soft {
		t.Error("errors.As through wrapping")
	}
}

func TestErrorCloseMethodTruncatesText(t *testing.T) {
	// A RESOURCE_LOCKED text with a 255-byte queue name is well over 255 bytes.
	for _, name := range []string{strings.Repeat("q", 255), strings.Repeat("é", 127) + "x"} {
		e := ResourceLocked("cannot obtain exclusive access to locked queue '%s' in vhost '/'", name)
		cm := e.CloseMethod().(*ChannelClose)
		if len(cm.ReplyText) > 255 || !utf8.ValidString(cm.ReplyText) || !strings.HasPrefix(e.Text, cm.ReplyText) {
			t.Fatalf("text of %d bytes, valid %v", len(cm.ReplyText), utf8.ValidString(cm.ReplyText))
		}
		if len(cm.ReplyText) < 252 {
			t.Fatalf("cut too much: %d bytes", len(cm.ReplyText))
		}
		if _, err := AppendMethod(nil, cm); err != nil {
			t.Fatal(err)
		}
	}
}
