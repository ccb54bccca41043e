// The book's icon script: draws <i class="fa-solid fa-NAME"> as inline SVG, as Font Awesome's
// script does, but holding only the icons the pages use (written in at build time by
// book/_ext/attnbook_site.py). Icons are decoration: hidden from screen readers, whose buttons
// and links carry their own names.
(function () {
  var ICONS = /*ICONS*/{};
  var NS = "http://www.w3.org/2000/svg";
  var css = document.createElement("style");
  css.textContent = ".svg-inline--fa{display:inline-block;height:1em;overflow:visible;vertical-align:-.125em}" +
    ".svg-inline--fa.fa-lg{font-size:1.25em;line-height:.05em;vertical-align:-.2em}";
  document.head.appendChild(css);
  function style(el) {
    var c = el.classList;
    return c.contains("fa-brands") || c.contains("fab") ? "fab" : c.contains("fa-regular") || c.contains("far") ? "far" : "fas";
  }
  function draw(el) {
    var names = Array.prototype.filter.call(el.classList, function (c) { return c.indexOf("fa-") === 0; });
    var set = ICONS[style(el)] || {}, icon = null;
    for (var i = 0; i < names.length && !icon; i++) icon = set[names[i].slice(3)];
    if (!icon) return;
    var svg = document.createElementNS(NS, "svg");
    Array.prototype.forEach.call(el.attributes, function (a) { if (a.name !== "title") svg.setAttribute(a.name, a.value); });
    svg.setAttribute("class", el.getAttribute("class") + " svg-inline--fa");
    svg.setAttribute("viewBox", "0 0 " + icon[0] + " " + icon[1]);
    svg.setAttribute("aria-hidden", "true");
    svg.setAttribute("focusable", "false");
    [].concat(icon[2]).forEach(function (d) {
      var path = document.createElementNS(NS, "path");
      path.setAttribute("fill", "currentColor");
      path.setAttribute("d", d);
      svg.appendChild(path);
    });
    el.replaceWith(svg);
  }
  function drawAll(root) {
    (root.querySelectorAll ? root.querySelectorAll("i[class*='fa-'], span[class*='fa-']") : []).forEach(draw);
  }
  drawAll(document);
  new MutationObserver(function (changes) {
    changes.forEach(function (c) { c.addedNodes.forEach(function (n) { if (n.nodeType === 1) { if (n.matches("i[class*='fa-'], span[class*='fa-']")) draw(n); else drawAll(n); } }); });
  }).observe(document.body, { childList: true, subtree: true });
})();
