// Orbit console: progressive enhancement only; every page works without this file.
// A form with data-confirm asks before it is sent (pause, resume).
"use strict";
document.addEventListener("submit", function (event) {
  var form = event.target;
  var question = form.getAttribute && form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});
