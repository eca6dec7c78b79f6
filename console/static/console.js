// The console works without this script; it only keeps the overview
// live and submits the outbox picker.
(function () {
  "use strict";
  function refresh(el) {
    fetch(el.dataset.live, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (res) {
        if (res.redirected || !res.ok) { throw new Error("status " + res.status); }
        return res.text();
      })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var next = doc.getElementById(el.id);
        if (next) { el.replaceWith(next); watch(next); }
      })
      .catch(function () { setTimeout(function () { refresh(el); }, 5000); });
  }
  function watch(el) { setTimeout(function () { refresh(el); }, 2000); }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live]").forEach(watch);
    document.querySelectorAll("select[data-autosubmit]").forEach(function (s) {
      s.addEventListener("change", function () { s.form.submit(); });
    });
  });
})();
