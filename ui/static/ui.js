// The page's one script (served from 'self'): a form marked data-confirm asks before it is sent.
document.addEventListener("submit", function (event) {
  var text = event.target.getAttribute("data-confirm");
  if (text && !window.confirm(text)) {
    event.preventDefault();
  }
});
