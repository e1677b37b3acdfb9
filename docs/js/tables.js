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
      // the outermost box that holds it (Material's table box may grow with the table)
      const box = table.closest(".md-typeset__scrollwrap") || table.closest(".md-typeset__table")
        || table.closest(".jp-OutputArea-output") || table.parentElement;
      const wide = (e) => e.scrollWidth > e.clientWidth + 1;
      // the table or any box between it and the outermost one overflows
      let over = table.getBoundingClientRect().right > box.getBoundingClientRect().right + 1;
      for (let e = table; e && !over; e = e.parentElement) {
        over = wide(e);
        if (e === box) break;
      }
      if (over) table.classList.add("stacked");
    }
  }
  window.bayesattnFitTables = fit;
  document.addEventListener("DOMContentLoaded", fit);
  window.addEventListener("load", function () {
    fit();
    setTimeout(fit, 500); // after late layout changes (images, fonts)
  });
  window.addEventListener("resize", fit);
  // after every typesetting pass (formulas change widths)
  function hook() {
    if (window.MathJax && MathJax.Hub && MathJax.Hub.Register) {
      MathJax.Hub.Register.MessageHook("End Process", fit);
      MathJax.Hub.Register.StartupHook("End", fit);
    }
  }
  if (window.MathJax && MathJax.Hub) hook();
  else document.addEventListener("DOMContentLoaded", hook);
})();
