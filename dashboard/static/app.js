// gendurable dashboard: confirmation prompts and optional auto-refresh.
// Everything works without it.
"use strict";
document.addEventListener("submit", function (e) {
  var msg = e.target.getAttribute("data-confirm");
  if (msg && !window.confirm(msg)) e.preventDefault();
});
(function () {
  var u = new URL(window.location.href);
  if (u.searchParams.has("flash")) { // a reload must not repeat the message
    u.searchParams.delete("flash");
    window.history.replaceState(null, "", u.pathname + u.search + u.hash);
  }
  var el = document.querySelector("[data-refresh]");
  var s = el && parseInt(el.getAttribute("data-refresh"), 10);
  if (s > 0) window.setTimeout(function () { window.location.reload(); }, s * 1000);
})();
