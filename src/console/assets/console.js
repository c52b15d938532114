// smtp-once console: the only script. It refreshes the message list
// (table#messages) every 10 s from `?fragment=1`; every function of the
// console works without it.
(function () {
  "use strict";
  var table = document.getElementById("messages");
  if (!table || !window.fetch || !table.dataset.refresh) {
    return;
  }
  var every = parseInt(table.dataset.refresh, 10) * 1000;
  function refresh() {
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    fetch(url.toString(), { credentials: "same-origin", redirect: "manual" })
      .then(function (r) {
        return r.ok ? r.text() : null;
      })
      .then(function (text) {
        if (!text) {
          return;
        }
        var box = document.createElement("div");
        box.innerHTML = text;
        var fresh = box.querySelector("#messages");
        var old = document.getElementById("messages");
        // Not while someone is tabbing through the rows.
        if (fresh && old && !old.contains(document.activeElement)) {
          old.replaceWith(fresh);
        }
      })
      .catch(function () {});
  }
  window.setInterval(refresh, every);
})();
