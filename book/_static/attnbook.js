// The book's own fixes to the theme's markup, for screen readers and keyboards
// (listed in _config.yml, html_js_files). Runs once the page, and the theme's deferred scripts, are ready.
document.addEventListener("DOMContentLoaded", function () {
  // A search field-button shows "Search Ctrl+K"; its name should contain what it shows, so it
  // takes its name from its text instead of the shorter aria-label "Search".
  document.querySelectorAll(".search-button-field[aria-label]").forEach(function (b) { b.removeAttribute("aria-label"); });
  // The colour-mode button's icons are decoration; the button's name is "Color mode".
  document.querySelectorAll(".theme-switch-button .theme-switch").forEach(function (icon) {
    icon.removeAttribute("title");
    icon.setAttribute("aria-hidden", "true");
    icon.querySelectorAll("title").forEach(function (t) { t.remove(); });
  });
  // A hidden cell's toggle shows "Show code cell source"; its name should be what it shows.
  document.querySelectorAll("summary[aria-label]").forEach(function (s) {
    if (s.textContent.trim()) s.removeAttribute("aria-label");
  });
  // The sidebar (logo, search, table of contents) is a landmark, so no content lies outside one.
  var sidebar = document.getElementById("pst-primary-sidebar");
  if (sidebar && !sidebar.hasAttribute("role")) { sidebar.setAttribute("role", "complementary"); sidebar.setAttribute("aria-label", "Book"); }
  // Skip links to each interactive (shown when focused, next to the theme's "Skip to main
  // content"): a keyboard reader reaches a slider or the quiz in a few Tab presses instead of
  // passing every link, copy button and code block before it.
  var skip = document.getElementById("pst-skip-link");
  if (skip) {
    document.querySelectorAll(".attnlib-slider[id], .attnbook-quiz[id]").forEach(function (w) {
      var title = document.getElementById(w.id + "-title");
      var link = document.createElement("a");
      link.href = "#" + w.id;
      link.className = "attnbook-skip";
      link.textContent = w.classList.contains("attnbook-quiz") ? "Skip to the quiz" : "Skip to the slider: " + (title ? title.textContent : "");
      skip.appendChild(link);
    });
  }
  // Figures: a tap or click opens the image at full size, where a phone can zoom into it.
  document.querySelectorAll(".cell_output img").forEach(function (img) {
    if (img.closest("a")) return;
    var link = document.createElement("a");
    link.href = img.src;
    link.className = "attnbook-zoom";
    link.setAttribute("aria-label", "Open the figure full size" + (img.alt ? ": " + img.alt : ""));
    img.replaceWith(link);
    link.appendChild(img);
  });
});

// Phones and tablets: every visible sidebar button opens its drawer. pydata-sphinx-theme 0.17 and
// sphinx-book-theme 1.3 bind only the first `.primary-toggle` / `.secondary-toggle` of the page
// (pydata-sphinx-theme#2451). _config.yml leaves the theme's top navbar, which held a hidden first
// pair, out of the page; should a theme update bring a second pair back, a tap on any later
// button is handed to the first one, which the theme has bound.
document.addEventListener("DOMContentLoaded", function () {
  ["primary", "secondary"].forEach(function (kind) {
    var toggles = document.querySelectorAll("." + kind + "-toggle");
    for (var i = 1; i < toggles.length; i++) {
      toggles[i].addEventListener("click", function (e) {
        e.preventDefault();
        e.stopImmediatePropagation();
        toggles[0].click();
      }, true);
    }
  });
});

// A solution opens from anywhere on its title. sphinx-exercise makes most of the title a link back to
// the exercise, and sphinx-togglebutton 0.4.5 finds no button for a click on that link: the page
// scrolled up, the solution stayed closed and togglebutton.js threw "button is not defined". A
// click on the title is given to the title's own toggle button instead (capture phase, before the
// link or togglebutton.js see it); the button itself still works as before.
document.addEventListener("click", function (e) {
  var title = e.target.closest && e.target.closest(".toggle > .admonition-title");
  if (!title || e.target.closest(".toggle-button")) return;
  var button = title.querySelector(".toggle-button");
  if (!button) return;
  e.preventDefault();
  e.stopPropagation();
  button.click();
}, true);

// Wide screens: a code or output box wider than the text column reaches under the page's table of
// contents (attnbook.css). While one passes under it, the table of contents folds to its title
// (sphinx-book-theme's own "hide" class, which it uses for margin content; hovering opens it). Only
// the boxes that do reach under it are watched, in the band of the screen it covers; both are
// measured again with the scrolling boxes above (mark), whenever something may have changed them.
var watchWideBoxes = (function () {
  var BOXES = "div.cell_input, .cell_output > .output.stream, .cell_output > .output.text_plain, .bd-article section > div[class^='highlight-'], .bd-article li > div[class^='highlight-']";
  var observer = null;
  return function () {
    if (observer) observer.disconnect();
    var toc = document.querySelector(".bd-sidebar-secondary");
    var list = toc && toc.querySelector("nav.page-toc");
    if (!list || !window.matchMedia("(min-width: 1200px)").matches) {
      if (toc) toc.classList.remove("hide");
      return;
    }
    var left = list.getBoundingClientRect().left;
    // Only boxes the reader can see: one inside a closed <details> (a folded cell) has a size but is
    // not drawn, and never passes under the contents (opening it measures again, see "toggle" below).
    var wide = [].filter.call(document.querySelectorAll(BOXES), function (box) {
      return box.getBoundingClientRect().right > left + 1 && (!box.checkVisibility || box.checkVisibility());
    });
    var under = new Set();
    var band = Math.min(toc.scrollHeight, window.innerHeight);
    observer = new IntersectionObserver(function (entries) {
      entries.forEach(function (e) { if (e.isIntersecting) under.add(e.target); else under.delete(e.target); });
      toc.classList.toggle("hide", under.size > 0);
    }, { rootMargin: "0px 0px " + (band - window.innerHeight) + "px 0px" });
    wide.forEach(function (box) { observer.observe(box); });
    if (!wide.length) toc.classList.remove("hide");
  };
})();

// A box that scrolls sideways must be reachable by keyboard, so that the arrow keys can scroll it:
// wide code blocks and outputs (the theme marks these once, at load), display formulas (no
// longer Tab stops, see _config.yml), the heatmaps of a slider on a phone. They are measured
// again whenever something may have changed their width: a resize, a solution or a hidden
// cell opened, a slider moved.
(function () {
  var BOXES = "pre, .cell_output > .output, .pst-scrollable-table-container, .attnlib-frame, mjx-container[display='true']";
  function markBox(box) {
    var scrolls = box.scrollWidth > box.clientWidth + 1;
    if (scrolls) box.setAttribute("tabindex", "0");
    else if (box.getAttribute("tabindex") === "0") box.setAttribute("tabindex", "-1");
  }
  function mark() { document.querySelectorAll(BOXES).forEach(markBox); watchWideBoxes(); }
  var timer = null;
  function later() { clearTimeout(timer); timer = setTimeout(mark, 350); }
  // A slider's frame box is marked in the same event that redraws it: one frame of a slider can
  // be wide and the next narrow, and its keyboard access must not lag a frame behind. The input
  // event does not bubble, so a listener added to the slider's input from the capture phase runs
  // right after the slider's own listener has drawn the frame.
  function frameDrawn(e) {
    var root = e.target && e.target.closest && e.target.closest(".attnlib-slider");
    if (!root) return;
    e.target.addEventListener("input", function () {
      root.querySelectorAll(".attnlib-frame").forEach(markBox);
    }, { once: true });
  }
  window.addEventListener("load", function () {
    var ready = window.MathJax && MathJax.startup && MathJax.startup.promise;
    (ready || Promise.resolve()).then(mark);
    window.addEventListener("resize", later);
    document.addEventListener("click", later, true);
    document.addEventListener("toggle", later, true);
    document.addEventListener("input", later, true);
    document.addEventListener("input", frameDrawn, true);
  });
})();

