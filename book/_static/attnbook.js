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
  // The sidebar (logo, search, table of contents) is a landmark, so no content lies outside one.
  var sidebar = document.getElementById("pst-primary-sidebar");
  if (sidebar && !sidebar.hasAttribute("role")) { sidebar.setAttribute("role", "complementary"); sidebar.setAttribute("aria-label", "Book"); }
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
