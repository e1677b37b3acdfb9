// Tables that do not fit their column become cards: one card per row, each cell under its
// column's name (stacked tables never scroll sideways). Re-checked when the window is resized and
// after MathJax typesets (formulas change widths). The CSS is in css/extra.css (table.stacked).
(function () {
  function label(table) {
    const head = table.querySelector("thead tr") || table.querySelector("tr");
    if (!head) return;
    const names = Array.from(head.children).map((c) => c.textContent.trim());
    for (const row of table.querySelectorAll("tbody tr")) {
      Array.from(row.children).forEach((cell, i) => {
        if (names[i] && !cell.hasAttribute("data-label")) cell.setAttribute("data-label", names[i]);
      });
    }
  }
  function fit() {
    for (const table of document.querySelectorAll("article table")) {
      if (table.closest(".highlight")) continue; // code line-number tables
      label(table);
      table.classList.remove("stacked");
      const box = table.closest(".md-typeset__table, .md-typeset__scrollwrap, .jp-OutputArea-output")
        || table.parentElement;
      if (table.scrollWidth > box.clientWidth + 1 || table.getBoundingClientRect().right > box.getBoundingClientRect().right + 1) {
        table.classList.add("stacked");
      }
    }
  }
  window.bayesattnFitTables = fit;
  document.addEventListener("DOMContentLoaded", fit);
  window.addEventListener("load", fit);
  window.addEventListener("resize", fit);
  if (window.MathJax && MathJax.Hub) MathJax.Hub.Register.StartupHook("End", fit);
  else document.addEventListener("DOMContentLoaded", function () {
    if (window.MathJax && MathJax.Hub) MathJax.Hub.Register.StartupHook("End", fit);
  });
})();
