// A small SVG renderer for the Vega-Lite specs sqlflow emits (switchyard/text2sql/chart.py):
// bars (optionally stacked by colour) and lines (optionally one per `fold`ed measure).
// Not Vega: any other spec is reported as unsupported instead of drawn wrong.

const NS = "http://www.w3.org/2000/svg";
const W = 640, H = 300, M = { top: 16, right: 16, bottom: 64, left: 64 };
const COLOURS = ["#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2", "#ff9da6"];

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function niceTicks(max, count = 5) {
  if (max <= 0) return [0];
  const raw = max / count, mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const ticks = [];
  // Up to the first tick at or above `max`, so the tallest mark stays inside the axis.
  for (let t = 0; ; t += step) {
    ticks.push(+t.toPrecision(12));
    if (t >= max) break;
  }
  return ticks;
}

const label = (v) => (typeof v === "number" ? +v.toPrecision(6) : String(v));

// Rows of {x, y, series}, from the spec's data, fold transform and encoding.
function points(spec) {
  const enc = spec.encoding || {};
  let rows = (spec.data && spec.data.values) || [];
  for (const t of spec.transform || []) {
    if (!t.fold) return null;
    const [key, value] = t.as || ["key", "value"];
    rows = rows.flatMap((r) => t.fold.map((f) => ({ ...r, [key]: f, [value]: r[f] })));
  }
  if (!enc.x || !enc.y) return null;
  return rows.map((r) => ({
    x: r[enc.x.field], y: Number(r[enc.y.field]) || 0,
    series: enc.color ? String(r[enc.color.field]) : "",
  }));
}

export function renderChart(spec, container) {
  container.replaceChildren();
  const mark = typeof spec.mark === "string" ? spec.mark : spec.mark && spec.mark.type;
  const pts = points(spec);
  if (!pts || !["bar", "line"].includes(mark)) {
    container.textContent = `Chart type ${mark || "?"} is not drawn by this console.`;
    return false;
  }
  const enc = spec.encoding;
  let xs = [...new Set(pts.map((p) => p.x))];
  if (enc.x.type === "temporal") xs.sort();
  else if (enc.x.sort === "-y") {
    const total = (x) => pts.filter((p) => p.x === x).reduce((a, p) => a + p.y, 0);
    xs.sort((a, b) => total(b) - total(a));
  }
  const series = [...new Set(pts.map((p) => p.series))];
  const colour = (s) => COLOURS[series.indexOf(s) % COLOURS.length];
  const stackTop = (x) => pts.filter((p) => p.x === x).reduce((a, p) => a + Math.max(0, p.y), 0);
  const max = Math.max(1e-9, ...(mark === "bar" ? xs.map(stackTop) : pts.map((p) => p.y)));
  const ticks = niceTicks(max), top = ticks[ticks.length - 1] || max;
  const iw = W - M.left - M.right, ih = H - M.top - M.bottom;
  const y = (v) => M.top + ih - (v / top) * ih;
  const band = iw / Math.max(1, xs.length);
  const xAt = (x) => M.left + band * xs.indexOf(x) + band / 2;

  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", class: `chart-${mark}`,
    "aria-label": `${mark} chart of ${enc.y.field} by ${enc.x.field}` });
  for (const t of ticks) {
    root.append(svg("line", { x1: M.left, x2: W - M.right, y1: y(t), y2: y(t), class: "grid" }));
    root.append(svg("text", { x: M.left - 6, y: y(t) + 4, "text-anchor": "end" }, label(t)));
  }
  const every = Math.ceil(xs.length / 16); // at most ~16 x labels
  xs.forEach((x, i) => {
    if (i % every) return;
    const tx = xAt(x), ty = H - M.bottom + 14;
    root.append(svg("text", { x: tx, y: ty, "text-anchor": "end",
      transform: `rotate(-35 ${tx} ${ty})` }, label(x)));
  });
  root.append(svg("text", { x: 12, y: M.top + ih / 2, transform: `rotate(-90 12 ${M.top + ih / 2})`,
    "text-anchor": "middle", class: "axis-title" }, enc.y.field));

  if (mark === "bar") {
    const base = new Map(xs.map((x) => [x, 0]));
    for (const p of pts) {
      const from = base.get(p.x), to = from + Math.max(0, p.y);
      base.set(p.x, to);
      const r = svg("rect", { x: xAt(p.x) - band * 0.4, width: band * 0.8, y: y(to),
        height: Math.max(0, y(from) - y(to)), fill: colour(p.series), class: "bar" });
      r.append(svg("title", {}, `${label(p.x)}${p.series ? ` · ${p.series}` : ""}: ${label(p.y)}`));
      root.append(r);
    }
  } else {
    for (const s of series) {
      const line = pts.filter((p) => p.series === s).sort((a, b) => xs.indexOf(a.x) - xs.indexOf(b.x));
      const d = line.map((p, i) => `${i ? "L" : "M"}${xAt(p.x).toFixed(1)},${y(p.y).toFixed(1)}`).join("");
      root.append(svg("path", { d, fill: "none", stroke: colour(s), "stroke-width": 2, class: "line" }));
    }
  }
  if (series.length > 1) {
    series.forEach((s, i) => {
      root.append(svg("rect", { x: W - M.right - 120, y: M.top + i * 16, width: 10, height: 10, fill: colour(s) }));
      root.append(svg("text", { x: W - M.right - 104, y: M.top + i * 16 + 9 }, s));
    });
  }
  container.append(root);
  return true;
}
