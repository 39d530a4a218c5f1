// Small inline-SVG charts: a stacked bar with markers, and an x-y chart of
// lines and points. Colours come from CSS classes, so they follow the
// light or dark theme. Every chart has a text label for screen readers.
// Does not: fetch or hold data.

const NS = "http://www.w3.org/2000/svg";

export function el(tag, attrs = {}, text = null) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  return node;
}

function frame(width, height, label) {
  const root = el("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": label,
                           preserveAspectRatio: "xMidYMid meet" });
  root.append(el("title", {}, label));
  return root;
}

/** A step of 1, 2 or 5 times a power of ten giving about n ticks up to max
 *  (whole numbers only when `whole`). */
function ticks(max, n = 5, whole = false) {
  if (!(max > 0)) return [0];
  const raw = max / n, power = 10 ** Math.floor(Math.log10(raw));
  let step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
  if (whole) step = Math.max(1, Math.round(step));
  const out = [];
  for (let v = 0; v <= max + step * 1e-9; v += step) out.push(+v.toPrecision(12));
  return out;
}

const short = (v) => (Math.abs(v) >= 1000 ? `${+(v / 1000).toFixed(1)}k` : `${+v.toPrecision(3)}`);

/**
 * A horizontal stacked bar: segments [{value, label, cls}] laid end to end on
 * a scale to `max`, markers [{value, label, cls}] as labelled ticks over it.
 */
export function stackedBar({ segments, markers = [], max, label, format = short, width = 640 }) {
  const W = Math.max(width, 280), left = 8, right = 8, barH = 26;
  const placed = placeLabels(markers, (v) => left + (Math.max(v, 0) / max) * (W - left - right), format, W);
  const above = Math.max(0, ...placed.filter((p) => p.row % 2 === 0).map((p) => p.row / 2 + 1));
  const below = Math.max(0, ...placed.filter((p) => p.row % 2 === 1).map((p) => (p.row + 1) / 2));
  const top = 8 + 15 * above, H = top + barH + 8 + 15 * below;
  const scale = (v) => left + (Math.max(v, 0) / max) * (W - left - right);
  const root = frame(W, H, label);
  let x = 0;
  for (const s of segments) {
    if (s.value <= 0) continue;
    const x0 = scale(x), x1 = scale(x + s.value);
    root.append(el("rect", { x: x0, y: top, width: Math.max(x1 - x0, 1), height: barH, class: `seg ${s.cls}` },
                   null));
    root.lastChild.append(el("title", {}, `${s.label}: ${format(s.value)}`));
    if (x1 - x0 > 70) {
      root.append(el("text", { x: (x0 + x1) / 2, y: top + barH / 2 + 4, class: "seg-label",
                               "text-anchor": "middle" }, `${s.label} ${format(s.value)}`));
    }
    x += s.value;
  }
  for (const p of placed) {
    const level = Math.floor(p.row / 2), y = p.row % 2 === 0 ? top - 5 - 15 * level : top + barH + 14 + 15 * level;
    root.append(el("line", { x1: p.x, x2: p.x, y1: Math.min(y, top - 4), y2: Math.max(y - 10, top + barH + 4),
                             class: `marker ${p.cls}` }));
    root.append(el("text", { x: p.x, y, class: `marker-label ${p.cls}`, "text-anchor": p.anchor }, p.text));
  }
  return root;
}

/** Rows for marker labels so that none overlaps another: rows alternate
 *  above and below the bar, each further out than the last. */
function placeLabels(markers, scale, format, W) {
  const ends = []; // per row: where its last label ends
  return [...markers].sort((a, b) => a.value - b.value).map((m) => {
    const text = `${m.label} ${format(m.value)}`, x = scale(m.value), w = text.length * 7;
    const anchor = x < w / 2 ? "start" : x > W - w / 2 ? "end" : "middle";
    const from = anchor === "start" ? x : anchor === "end" ? x - w : x - w / 2;
    let row = 0;
    while (ends[row] !== undefined && ends[row] > from - 6) row++;
    ends[row] = from + w;
    return { ...m, x, text, row, anchor };
  });
}

/**
 * An x-y chart. series: [{points: [[x, y]...], kind: "line"|"dots", cls, label,
 * hollow?: (point) => bool}]; hLines/vLines: [{value, label, cls}].
 */
export function xyChart({ series, hLines = [], vLines = [], xLabel, yLabel, label, xMax, yMax,
                          xFormat = short, yFormat = short, wholeX = false, width = 640 }) {
  const W = Math.max(width, 280), H = Math.round(Math.min(300, Math.max(200, W * 0.5))), L = 52, R = 14, T = 14, B = 42;
  const all = series.flatMap((s) => s.points);
  xMax = xMax || Math.max(1e-9, ...all.map((p) => p[0]), ...vLines.map((l) => l.value));
  yMax = yMax || Math.max(1e-9, ...all.map((p) => p[1]), ...hLines.map((l) => l.value)) * 1.08;
  const xs = ticks(xMax, W < 420 ? 4 : 6, wholeX), ys = ticks(yMax);
  xMax = Math.max(xMax, xs[xs.length - 1]);
  yMax = Math.max(yMax, ys[ys.length - 1]);
  const sx = (v) => L + (v / xMax) * (W - L - R), sy = (v) => H - B - (v / yMax) * (H - T - B);
  const root = frame(W, H, label);
  for (const t of ys) {
    root.append(el("line", { x1: L, x2: W - R, y1: sy(t), y2: sy(t), class: "grid" }));
    root.append(el("text", { x: L - 6, y: sy(t) + 4, "text-anchor": "end", class: "tick" }, yFormat(t)));
  }
  for (const t of xs) {
    root.append(el("text", { x: sx(t), y: H - B + 16, "text-anchor": "middle", class: "tick" }, xFormat(t)));
  }
  root.append(el("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
  root.append(el("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }));
  root.append(el("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", class: "axis-label" }, xLabel));
  root.append(el("text", { x: 12, y: (T + H - B) / 2, "text-anchor": "middle", class: "axis-label",
                           transform: `rotate(-90 12 ${(T + H - B) / 2})` }, yLabel));
  for (const l of hLines) {
    root.append(el("line", { x1: L, x2: W - R, y1: sy(l.value), y2: sy(l.value), class: `marker ${l.cls}` }));
    root.append(el("text", { x: W - R - 4, y: sy(l.value) - 5, "text-anchor": "end", class: `marker-label ${l.cls}` },
                   `${l.label} ${yFormat(l.value)}`));
  }
  for (const l of vLines) {
    root.append(el("line", { x1: sx(l.value), x2: sx(l.value), y1: T, y2: H - B, class: `marker ${l.cls}` }));
  }
  for (const s of series) {
    if (s.kind === "line" && s.points.length) {
      const d = s.points.map((p, i) => `${i ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
      root.append(el("path", { d, class: `line ${s.cls}` }));
    }
    if (s.kind === "dots" || s.kind === "line-dots") {
      for (const p of s.points) {
        const dot = el("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 4,
                                   class: `dot ${s.cls}${s.hollow && s.hollow(p) ? " hollow" : ""}` });
        dot.append(el("title", {}, `${s.label}: ${xFormat(p[0])}, ${yFormat(p[1])}`));
        root.append(dot);
      }
      if (s.kind === "line-dots" && s.points.length) {
        const d = s.points.map((p, i) => `${i ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
        root.append(el("path", { d, class: `line ${s.cls}` }));
      }
    }
  }
  return root;
}

/** A legend: [{label, cls}] as a list of swatches. */
export function legend(items) {
  const list = document.createElement("ul");
  list.className = "legend";
  for (const item of items) {
    const li = document.createElement("li");
    const swatch = document.createElement("span");
    swatch.className = `swatch ${item.cls}`;
    swatch.setAttribute("aria-hidden", "true");
    li.append(swatch, item.label);
    list.append(li);
  }
  return list;
}
