// MathJax 2.7 (served from this site, see docs/hooks.py), set before MathJax.js loads.
// pymdownx.arithmatex (generic) wraps page maths in .arithmatex as \( \) and \[ \]; notebook
// markdown cells (inside .jupyter-wrapper) keep $ $ and $$ $$. Nothing else is typeset.
window.MathJax = {
  // the combined configuration shipped with the package (TeX input, HTML-CSS output)
  config: ["TeX-AMS-MML_HTMLorMML-full.js"],
  tex2jax: {
    inlineMath: [["$", "$"], ["\\(", "\\)"]],
    displayMath: [["$$", "$$"], ["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
    ignoreClass: "md-container",
    processClass: "arithmatex|jupyter-wrapper",
  },
  "HTML-CSS": {
    availableFonts: [],
    preferredFont: null,
    webFont: "STIX-Web",
    imageFont: null,
    // no automatic line breaks: MathJax 2.7 measures the column wrongly inside flex boxes and
    // breaks short equations, hiding their second line; a wide equation scrolls (docs/css/extra.css)
    linebreaks: { automatic: false },
  },
  "fast-preview": { disabled: true },  // its preview uses TeX fonts the package does not ship
  // its hidden MathML copy asks for TeX fonts the package does not ship
  AssistiveMML: { disabled: true },
  menuSettings: { assistiveMML: false },
  showMathMenu: false,
  messageStyle: "none",
};
