package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/kubemq-io/kubemq-proxy/internal/testenv"
)

// browser starts headless Chromium (Debian's chromium) for t, or skips t without it.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		testenv.Missing(t, "chromium not installed (apt-get install chromium)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.UserDataDir(t.TempDir()))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelB := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	ctx, cancelT := context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(func() { cancelT(); cancelB(); cancelA() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

// run runs one browser action and returns its value; an error ends the test.
func run[T any](t *testing.T, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// ignore drops an action's value so it can be one of Do's steps.
func ignore[T any](a chromedp.Action[T]) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		_, err := a(ctx, tg)
		return chromedp.Void{}, err
	}
}

// js quotes s as a JavaScript string literal.
func js(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// shot takes a screenshot of the viewport, keeps it under the test's artifacts when
// CONSOLE_SCREENSHOTS names a directory, and checks its structure: the viewport's size, the
// dark header band across the top, and page content (non-background pixels) below it.
func shot(t *testing.T, ctx context.Context, name string) image.Image {
	t.Helper()
	buf, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if dir := os.Getenv("CONSOLE_SCREENSHOTS"); dir != "" {
		os.WriteFile(filepath.Join(dir, name+".png"), buf, 0o644)
	}
	img, err := png.Decode(bytes.NewReader(buf))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	b := img.Bounds()
	if b.Dx() < 1000 || b.Dy() < 600 {
		t.Errorf("screenshot %s is %dx%d, want the 1280x900 window", name, b.Dx(), b.Dy())
	}
	dark := func(x, y int) bool {
		r, g, bl, _ := img.At(x, y).RGBA()
		return (r+g+bl)/3 < 0x6000
	}
	// The header band: the row at y=8 is dark nearly across the width.
	n := 0
	for x := b.Min.X; x < b.Max.X; x++ {
		if dark(x, b.Min.Y+8) {
			n++
		}
	}
	if n < b.Dx()*9/10 {
		t.Errorf("screenshot %s: header band dark on %d of %d pixels", name, n, b.Dx())
	}
	// Content: some pixels below the header differ from the white background (headings,
	// table borders, text), and most of it is background (not a blank or error-colored page).
	var ink, total int
	for y := b.Min.Y + 60; y < b.Max.Y; y += 2 {
		for x := b.Min.X; x < b.Max.X; x += 2 {
			total++
			r, g, bl, _ := img.At(x, y).RGBA()
			if r < 0xF000 || g < 0xF000 || bl < 0xF000 {
				ink++
			}
		}
	}
	if ink < total/200 || ink > total*3/4 {
		t.Errorf("screenshot %s: %d of %d sampled content pixels are not background", name, ink, total)
	}
	return img
}

// The console in a real browser: the pages' structure, the live rate after publishes, an
// admin action through the UI (publishing a test message, which a Pub/Sub client then
// pulls), and screenshots with the expected layout.
func TestConsoleBrowser(t *testing.T) {
	f := newFixture(t, nil)
	f.publish(t, 1)
	ctx := browser(t)

	// / redirects to the overview; the rates table is polled.
	if err := chromedp.Do(ctx,
		chromedp.Navigate(f.base+"/"),
		chromedp.WaitVisible("#rates"),
		ignore(chromedp.Poll[bool](`document.querySelector("#rates").hasAttribute("data-updated")`)),
	); err != nil {
		t.Fatal(err)
	}
	h1, loc := run(t, ctx, chromedp.Text("h1")), run(t, ctx, chromedp.Location())
	if h1 != "Overview" || !strings.HasSuffix(loc, "/console/") {
		t.Errorf("/ shows %q at %s, want Overview at /console/", h1, loc)
	}
	headings := run(t, ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("h2")).map(e => e.textContent)`))
	if strings.Join(headings, "|") != "KubeMQ backend|Message rates|Summary" {
		t.Errorf("overview headings %q", headings)
	}

	// Publishes show in the live figures without a reload: the total grows and the rate is
	// above zero.
	before := run(t, ctx, chromedp.Text("#total-pubsub_published"))
	pctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub := f.ps.Publisher(f.topic)
	for i := 0; i < 20; i++ {
		if _, err := pub.Publish(pctx, &pubsub.Message{Data: []byte(fmt.Sprintf("live-%d", i))}).Get(pctx); err != nil {
			t.Fatal(err)
		}
	}
	pub.Stop()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](fmt.Sprintf(`Number(document.querySelector("#total-pubsub_published").textContent) >= %s + 20 &&
			Number(document.querySelector("#rate-pubsub_published").textContent) > 0`, before), chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("live rate did not update (total was %s): %v", before, err)
	}
	total, rate := run(t, ctx, chromedp.Text("#total-pubsub_published")), run(t, ctx, chromedp.Text("#rate-pubsub_published"))
	t.Logf("overview after 20 publishes: total %s, rate %s/s", total, rate)
	shot(t, ctx, "overview")

	// AMQP: the queue with the hostile name has its row, and the page holds no injected
	// element.
	if err := chromedp.Do(ctx, chromedp.Navigate(f.base+"/console/amqp"), chromedp.WaitVisible("#queues")); err != nil {
		t.Fatal(err)
	}
	hasQueue := run(t, ctx, chromedp.Evaluate[bool](fmt.Sprintf(`Array.from(document.querySelectorAll("#queues tbody tr")).some(r => r.dataset.queue === %s && r.querySelector(".name").textContent === %s)`, js(f.queue), js(f.queue))))
	hasExchange := run(t, ctx, chromedp.Evaluate[bool](fmt.Sprintf(`Array.from(document.querySelectorAll("#exchanges tbody tr")).some(r => r.dataset.exchange === %s)`, js(f.exchange))))
	injected := run(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("main img, main script").length`))
	headings = run(t, ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("h2")).map(e => e.textContent)`))
	if !hasQueue || !hasExchange || injected != 0 {
		t.Errorf("AMQP page: queue row %v, exchange row %v, injected elements %d", hasQueue, hasExchange, injected)
	}
	if strings.Join(headings, "|") != "Virtual hosts|Queues|Exchanges|Bindings|Connections and channels" {
		t.Errorf("AMQP headings %q", headings)
	}
	shot(t, ctx, "amqp")

	// Purge the queue through its button, accepting the confirmation the page asks for; a
	// client then finds the queue empty.
	asked := make(chan string, 4)
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			asked <- ev.Message
			if _, err := chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true}); err != nil {
				return
			}
		}
	}()
	purge := fmt.Sprintf(`Array.from(document.querySelectorAll("#queues tbody tr")).find(r => r.dataset.queue === %s).querySelector('form[data-action="amqp-purge"] button')`, js(f.queue))
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.JSPath(purge)), chromedp.WaitVisible("#result")); err != nil {
		t.Fatal(err)
	}
	select {
	case q := <-asked:
		if q != "Purge the ready messages of queue "+f.queue+"?" {
			t.Errorf("confirmation asked %q", q)
		}
	case <-time.After(10 * time.Second):
		t.Error("no confirmation asked before the purge")
	}
	if result := run(t, ctx, chromedp.Text("#result-message")); result != fmt.Sprintf("purged 1 messages from queue %q", f.queue) {
		t.Errorf("purge through the UI: %q", result)
	}
	if _, ok, err := f.ch.Get(f.queue, true); ok || err != nil {
		t.Errorf("basic.get after the purge: ok %v, err %v; want an empty queue", ok, err)
	}

	// Pub/Sub: publish a test message through the topic's form; a client pulls it.
	row := fmt.Sprintf(`tr[data-topic=%s]`, js(f.topic))
	if err := chromedp.Do(ctx,
		chromedp.Navigate(f.base+"/console/pubsub"),
		chromedp.WaitVisible(row),
		chromedp.SendKeys(row+` input[name="data"]`, "typed in the browser"),
		chromedp.Click(row+` button`),
		chromedp.WaitVisible("#result"),
	); err != nil {
		t.Fatal(err)
	}
	result := run(t, ctx, chromedp.Text("#result-message"))
	if !strings.Contains(result, "published message") {
		t.Fatalf("publish through the UI: %q", result)
	}
	shot(t, ctx, "pubsub-action")
	found, acked := false, 0
	for !found || acked < 22 { // 1 + 20 published by the client, 1 through the page
		resp, err := f.ps.SubscriptionAdminClient.Pull(pctx, &pubsubpb.PullRequest{Subscription: "projects/console-test/subscriptions/" + f.sub, MaxMessages: 100})
		if err != nil {
			t.Fatalf("pulling for the message published in the browser: %v", err)
		}
		var ids []string
		for _, m := range resp.GetReceivedMessages() {
			ids = append(ids, m.GetAckId())
			found = found || string(m.GetMessage().GetData()) == "typed in the browser"
		}
		if len(ids) > 0 {
			acked += len(ids)
			if err := f.ps.SubscriptionAdminClient.Acknowledge(pctx, &pubsubpb.AcknowledgeRequest{Subscription: "projects/console-test/subscriptions/" + f.sub, AckIds: ids}); err != nil {
				t.Fatal(err)
			}
		}
	}

	// The pulls and acks show in the overview's live totals.
	if err := chromedp.Do(ctx, chromedp.Navigate(f.base+"/console/"), chromedp.WaitVisible("#rates"),
		ignore(chromedp.Poll[bool](`Number(document.querySelector("#total-pubsub_delivered").textContent) >= 22 &&
			Number(document.querySelector("#total-pubsub_acked").textContent) >= 22`, chromedp.WithPollingTimeout(30*time.Second)))); err != nil {
		t.Errorf("delivered and acked totals did not reach 22: %v", err)
	}

	// The lease engine page lists the subscription's queue now that it was pulled.
	if err := chromedp.Do(ctx, chromedp.Navigate(f.base+"/console/leases"), chromedp.WaitVisible("#leases")); err != nil {
		t.Fatal(err)
	}
	h1 = run(t, ctx, chromedp.Text("h1"))
	leaseRows := run(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("#leases tbody tr:not(.empty)").length`))
	if h1 != "Lease engine" || leaseRows < 1 {
		t.Errorf("lease page: %q with %d rows", h1, leaseRows)
	}
	shot(t, ctx, "leases")
}
