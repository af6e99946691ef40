// agency ui: optional niceties; every page works without this file.
"use strict";
document.documentElement.classList.add("js");
document.addEventListener("DOMContentLoaded", function () {
  // Forms that ask first (cancel): a confirmation dialog.
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.getAttribute("data-confirm"))) event.preventDefault();
    });
  });
  // Pages of running or queued runs reload every few seconds, unless you are typing.
  var every = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  if (every > 0) {
    var typed = false;
    document.querySelectorAll("input, textarea, select").forEach(function (field) {
      field.addEventListener("input", function () { typed = true; });
    });
    window.setInterval(function () {
      var active = document.activeElement;
      var busy = active && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName);
      if (!typed && !busy) window.location.reload();
    }, every * 1000);
  }
});
