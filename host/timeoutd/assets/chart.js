// Stacked bars drawn as SVG in the page, no external assets: the one chart of the console's
// shadow section and of `timeoutd plugin whatif`'s report (both include this file).
// rows: [{label, values: [n, …]}], oldest or smallest first; parts: [[name, color], …] in
// stacking order, bottom first (each bar's rect has class `name`); caption: text under it.
function stackedBars(rows, parts, caption) {
  const ns = "http://www.w3.org/2000/svg", w = 600, h = 80;
  const bar = Math.max(2, Math.min(40, Math.floor(w / Math.max(1, rows.length)) - 2));
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", h + 16); svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", parts.map(([name]) => name).join(" and "));
  const top = Math.max(1, ...rows.map((r) => r.values.reduce((a, b) => a + b, 0)));
  rows.forEach((r, i) => {
    let y = h;
    parts.forEach(([name, color], k) => {
      const n = r.values[k] || 0;
      if (n === 0) return;
      const height = Math.max(1, Math.round((n / top) * h)); y -= height;
      const rect = document.createElementNS(ns, "rect");
      rect.setAttribute("x", i * (bar + 2)); rect.setAttribute("y", y);
      rect.setAttribute("width", bar); rect.setAttribute("height", height);
      rect.setAttribute("fill", color); rect.setAttribute("class", name);
      const tip = document.createElementNS(ns, "title"); tip.textContent = r.label + ": " + name + " " + n;
      rect.appendChild(tip); svg.appendChild(rect);
    });
  });
  const text = document.createElementNS(ns, "text");
  text.setAttribute("x", 0); text.setAttribute("y", h + 13); text.setAttribute("font-size", "11");
  text.textContent = caption + " (top: " + top + ")";
  svg.appendChild(text);
  return svg;
}
