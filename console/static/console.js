// The console's only script: live message rates on the overview, and the admin actions
// (POST with the X-Console-Request header, which HTML forms of other sites cannot send).
// Everything from the server is put in the page as text (textContent), never as HTML.
"use strict";

(function () {
  var intervalMs = 2000;

  function fmtRate(v) {
    if (!isFinite(v) || v < 0) { return "…"; }
    return v >= 100 ? v.toFixed(0) : v.toFixed(1);
  }

  function pollRates(table) {
    var url = table.getAttribute("data-poll");
    var last = null;
    document.getElementById("poll-seconds").textContent = String(intervalMs / 1000);
    function tick() {
      fetch(url, { credentials: "same-origin", cache: "no-store" })
        .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
        .then(function (s) {
          Object.keys(s.counters).forEach(function (k) {
            var total = document.getElementById("total-" + k);
            var rate = document.getElementById("rate-" + k);
            if (total) { total.textContent = String(Math.round(s.counters[k])); }
            if (rate && last && s.time_ms > last.time_ms && k in last.counters) {
              rate.textContent = fmtRate((s.counters[k] - last.counters[k]) * 1000 / (s.time_ms - last.time_ms));
            }
          });
          last = s;
          table.setAttribute("data-updated", String(s.time_ms));
        })
        .catch(function (e) { table.setAttribute("data-error", String(e)); })
        .finally(function () { setTimeout(tick, intervalMs); });
    }
    tick();
  }

  var box, title, message, peekTable, mutated = false;

  function show(name, res) {
    title.textContent = name + (res.ok ? ": done" : ": failed");
    message.textContent = res.ok ? res.message : res.error;
    box.classList.toggle("failed", !res.ok);
    var body = peekTable.tBodies[0];
    while (body.firstChild) { body.removeChild(body.firstChild); }
    peekTable.hidden = !(res.messages && res.messages.length);
    (res.messages || []).forEach(function (m) {
      var tags = Object.keys(m.tags || {}).sort().map(function (k) { return k + "=" + m.tags[k]; }).join("\n");
      var cells = [m.sequence, m.id, m.timestamp, m.receive_count, tags, m.size + (m.truncated ? " (cut)" : ""), m.body];
      var tr = document.createElement("tr");
      cells.forEach(function (c, i) {
        var td = document.createElement("td");
        td.textContent = String(c);
        if (i >= 4) { td.className = "mono"; }
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
    box.hidden = false;
  }

  function submitAction(form, ev) {
    ev.preventDefault();
    var name = form.getAttribute("data-action");
    var ask = form.getAttribute("data-confirm");
    if (ask && !window.confirm(ask)) { return; }
    var button = form.querySelector("button");
    if (button) { button.disabled = true; }
    fetch("/console/action/" + encodeURIComponent(name), {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-Console-Request": "1", "Content-Type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams(new FormData(form)).toString()
    })
      .then(function (r) { return r.json().catch(function () { return { ok: false, error: "HTTP " + r.status }; }); })
      .then(function (res) {
        if (res.ok && !/-peek$/.test(name)) { mutated = true; }
        show(name, res);
      })
      .catch(function (e) { show(name, { ok: false, error: String(e) }); })
      .finally(function () { if (button) { button.disabled = false; } });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var rates = document.getElementById("rates");
    if (rates) { pollRates(rates); }
    box = document.getElementById("result");
    title = document.getElementById("result-title");
    message = document.getElementById("result-message");
    peekTable = document.getElementById("peek-table");
    document.getElementById("result-close").addEventListener("click", function () {
      box.hidden = true;
      if (mutated) { window.location.reload(); }
    });
    Array.prototype.forEach.call(document.querySelectorAll("form.action"), function (f) {
      f.addEventListener("submit", function (ev) { submitAction(f, ev); });
    });
  });
})();
