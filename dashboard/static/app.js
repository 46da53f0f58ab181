// gendurable dashboard: confirmation prompts, bulk selection and
// auto-refresh without a page flash. Every page works without it.
"use strict";
document.addEventListener("submit", function (e) {
  // maxlength counts UTF-16 units, the server's limits count UTF-8 bytes:
  // 1,500 CJK characters pass the first and not the second. Refuse here,
  // saying so, before any prompt (the server refuses it anyway).
  var inputs = e.target.querySelectorAll("input[maxlength]");
  for (var i = 0; i < inputs.length; i++) {
    var inp = inputs[i], max = parseInt(inp.getAttribute("maxlength"), 10);
    var bytes = new TextEncoder().encode(inp.value).length;
    if (bytes > max) {
      e.preventDefault();
      inp.setCustomValidity("At most " + max + " bytes of UTF-8: this is " + bytes + ".");
      inp.reportValidity();
      return;
    }
  }
  var msg = e.target.getAttribute("data-confirm");
  var sub = e.submitter;
  if (sub && sub.getAttribute("data-confirm")) msg = sub.getAttribute("data-confirm");
  if (msg) {
    // Only a ticked-rows prompt counts: another carries the filter's own
    // text, which may hold "{n}" itself.
    if (sub && sub.value === "selected") {
      var n = document.querySelectorAll("input[data-bulk]:checked").length;
      msg = msg.replace("{n}", String(n));
    }
    if (!window.confirm(msg)) e.preventDefault();
  }
});

document.addEventListener("input", function (e) {
  if (e.target.matches && e.target.matches("input[maxlength]")) e.target.setCustomValidity("");
});

// Bulk selection: the header box ticks every row; the bar shows the count.
document.addEventListener("change", function (e) {
  var t = e.target;
  if (t.matches && t.matches("input[data-bulk-all]")) {
    document.querySelectorAll("input[data-bulk]").forEach(function (b) { b.checked = t.checked; });
  }
  if (t.matches && (t.matches("input[data-bulk]") || t.matches("input[data-bulk-all]"))) bulkCount();
});
function bulkCount() {
  var el = document.querySelector("[data-bulk-count]");
  if (el) el.textContent = String(document.querySelectorAll("input[data-bulk]:checked").length);
}

(function () {
  var u = new URL(window.location.href);
  if (u.searchParams.has("flash")) { // a reload must not repeat the message
    ["flash", "changed", "skipped", "not_found", "partial", "at", "sig"].forEach(function (k) { u.searchParams.delete(k); });
    window.history.replaceState(null, "", u.pathname + u.search + u.hash);
  }
  bulkCount();

  // busy: the reader is in the middle of something a swap would undo.
  function busy() {
    if (document.hidden) return "tab hidden";
    if (document.querySelector("input[data-bulk]:checked")) return "paused while rows are selected";
    var a = document.activeElement;
    if (a && a.closest("main") && a.matches("input:not([type=checkbox]), textarea, select")) return "paused while you edit";
    var sel = window.getSelection && window.getSelection();
    if (sel && String(sel).length > 0) return "paused while text is selected";
    return "";
  }
  function state(text) {
    var el = document.querySelector(".refresh-state");
    if (el) el.textContent = text;
  }
  function schedule() {
    var el = document.querySelector("[data-refresh]");
    var s = el && parseInt(el.getAttribute("data-refresh"), 10);
    if (s > 0) window.setTimeout(tick, s * 1000);
  }
  function tick() {
    var why = busy();
    if (why) { state(why); schedule(); return; }
    var open = [];
    document.querySelectorAll("main details[id][open]").forEach(function (d) { open.push(d.id); });
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (html) {
        if (busy()) return; // it became busy while the page loaded
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.querySelector("main");
        var cur = document.querySelector("main");
        if (!fresh || !cur) throw new Error("no page");
        open.forEach(function (id) {
          var d = fresh.querySelector("#" + CSS.escape(id));
          if (d && d.tagName === "DETAILS") d.open = true;
        });
        cur.replaceWith(fresh);
        var f = document.querySelector("footer"), nf = doc.querySelector("footer");
        if (f && nf) f.replaceWith(nf);
        document.title = doc.title;
        document.documentElement.setAttribute("data-refreshed", String(Date.now()));
        bulkCount();
        state("");
      })
      .catch(function (err) { state("refresh failed (" + err.message + "), retrying"); })
      .then(schedule);
  }
  schedule();
})();
