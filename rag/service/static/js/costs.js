// "Why it was fast": what one answer cost and why (cached and prefilled
// tokens, measured against predicted TTFT and the target, the passages
// chosen and dropped with their reasons, TTFT against the number of
// passages), and the calibrated prefill model as a curve over its points.
// Does not: ask or measure; it draws what the API reports.

import { getJson } from "./api.js";
import { legend, stackedBar, xyChart } from "./charts.js";
import { $, node } from "./dom.js";

const sec = (v) => `${Number(v).toFixed(2)} s`;
const REASONS = {
  ttft: "would pass the TTFT target",
  context: "no room left in the context window",
  relevance: "below the relevance floor",
  "near-duplicate": "overlaps a better passage of the same file",
  max_k: "the most passages a prompt may take",
};

function figures(answer, pageTtftMs) {
  const t = answer.timings, b = answer.budget;
  const rows = [
    ["prompt tokens", t.prompt_tokens], ["cached", t.cached_tokens], ["prefilled", t.prefill_tokens],
    ["measured TTFT", sec(t.ttft_s)], ["predicted", sec(b.predicted_ttft_s)],
    ["target", b.target_ttft_s === null ? "none" : sec(b.target_ttft_s)],
    ["passages", `${b.chosen} of ${b.candidates}`],
    ["answer", `${t.decode_tokens} tokens in ${sec(t.decode_s)}`],
  ];
  if (pageTtftMs !== null) rows.splice(4, 0, ["TTFT in this page", sec(pageTtftMs / 1000)]);
  return rows.map(([k, v]) => {
    const pair = node("div"), dd = node("dd", "", String(v));
    dd.dataset.figure = k;
    pair.append(node("dt", "", k), dd);
    return pair;
  });
}

const widthOf = (id) => $(id).clientWidth || 640;

function tokensChart(t) {
  return stackedBar({
    width: widthOf("tokens-chart"),
    label: `${t.prompt_tokens} prompt tokens: ${t.cached_tokens} cached, ${t.prefill_tokens} prefilled`,
    max: Math.max(t.prompt_tokens, 1),
    segments: [{ value: t.cached_tokens, label: "cached", cls: "cached" },
               { value: t.prefill_tokens, label: "prefilled", cls: "prefilled" }],
  });
}

function ttftChart(answer, pageTtftMs) {
  const t = answer.timings, b = answer.budget;
  const before = Math.max(t.ttft_s - t.prefill_s - t.restore_s - t.queue_s, 0);
  const markers = [{ value: b.predicted_ttft_s, label: "predicted", cls: "predicted" }];
  if (b.target_ttft_s !== null) markers.push({ value: b.target_ttft_s, label: "target", cls: "target" });
  if (pageTtftMs !== null) markers.push({ value: pageTtftMs / 1000, label: "page", cls: "page" });
  const max = Math.max(t.ttft_s, ...markers.map((m) => m.value)) * 1.06;
  markers.push({ value: t.ttft_s, label: "measured", cls: "measured" });
  return stackedBar({
    width: widthOf("ttft-chart"),
    label: `measured TTFT ${sec(t.ttft_s)}, predicted ${sec(b.predicted_ttft_s)}` +
           (b.target_ttft_s !== null ? `, target ${sec(b.target_ttft_s)}` : ""),
    max, markers, format: (v) => `${v.toFixed(2)}s`,
    segments: [{ value: t.queue_s, label: "queue", cls: "queue" },
               { value: before, label: "retrieval+plan", cls: "plan" },
               { value: t.restore_s, label: "restore", cls: "restore" },
               { value: t.prefill_s, label: "prefill", cls: "prefilled" }],
  });
}

function passagesChart(answer) {
  const t = answer.timings, b = answer.budget, chosen = b.decisions.filter((d) => d.chosen);
  const taken = chosen.map((d, i) => [i + 1, d.ttft_s]);
  const over = b.decisions.filter((d) => !d.chosen && d.reason === "ttft").map((d) => [chosen.length + 1, d.ttft_s]);
  const hLines = b.target_ttft_s === null ? [] : [{ value: b.target_ttft_s, label: "target", cls: "target" }];
  return xyChart({
    width: widthOf("passages-chart"), wholeX: true,
    label: `predicted TTFT with 1 to ${chosen.length} passages; measured ${sec(t.ttft_s)}`,
    xLabel: "passages in the prompt", yLabel: "TTFT, s",
    xMax: Math.max(chosen.length + (over.length ? 1 : 0), 1),
    series: [{ points: taken, kind: "line-dots", cls: "predicted", label: "predicted with it" },
             { points: over, kind: "dots", cls: "dropped", label: "dropped: would be" },
             { points: [[chosen.length, t.ttft_s]], kind: "dots", cls: "measured", label: "measured" }],
    hLines, xFormat: (v) => `${v}`, yFormat: (v) => `${+v.toFixed(2)}`,
  });
}

function decisionRows(decisions) {
  return decisions.map((d, i) => {
    const tr = node("tr", d.chosen ? "chosen" : "dropped");
    const outcome = d.chosen ? (d.trimmed ? "chosen, trimmed" : "chosen") : `dropped: ${d.reason}`;
    const cells = [i + 1, d.source, d.tokens, d.score.toFixed(3), d.ttft_s > 0 ? sec(d.ttft_s) : "–", outcome];
    tr.append(...cells.map((value) => node("td", "", String(value))));
    if (!d.chosen && REASONS[d.reason]) tr.lastChild.title = REASONS[d.reason];
    return tr;
  });
}

let shownAnswer = null, shownView = null; // drawn again at a new width

/** Draw the costs of `answer` (a /v1/ask object); `pageTtftMs` as the page measured it. */
export function showCosts(answer, pageTtftMs = null) {
  shownAnswer = [answer, pageTtftMs];
  $("why-empty").hidden = true;
  $("why-body").hidden = false;
  $("why-figures").replaceChildren(...figures(answer, pageTtftMs));
  $("tokens-chart").replaceChildren(tokensChart(answer.timings));
  $("ttft-chart").replaceChildren(ttftChart(answer, pageTtftMs), legend([
    { label: "queue", cls: "queue" }, { label: "retrieval and planning", cls: "plan" },
    { label: "KV restore", cls: "restore" }, { label: "prefill", cls: "prefilled" }]));
  $("passages-chart").replaceChildren(passagesChart(answer), legend([
    { label: "predicted TTFT with the passage", cls: "predicted" },
    { label: "measured", cls: "measured" }, { label: "dropped: what it would have cost", cls: "dropped" }]));
  $("decisions").tBodies[0].replaceChildren(...decisionRows(answer.budget.decisions));
}

/** Fetch and draw the calibrated prefill model (GET /v1/profile). */
export async function refreshProfile() {
  drawProfile(await getJson("/v1/profile"));
}

function drawProfile(view) {
  shownView = view;
  const point = (p) => [p.n_new, p.seconds, p.n_cached];
  const chart = xyChart({
    width: widthOf("profile-chart"),
    label: `prefill seconds against prompt tokens: ${view.points.length} measured points and the fitted ${view.fit.form} model`,
    xLabel: "tokens prefilled", yLabel: "seconds",
    series: [
      { points: view.curve.map((c) => [c.tokens, c.prefill_s]), kind: "line", cls: "fit", label: "fitted prefill" },
      { points: view.curve.map((c) => [c.tokens, c.ttft_s]), kind: "line", cls: "ttft-curve", label: "predicted TTFT" },
      { points: view.points.filter((p) => p.kind === "calibration").map(point), kind: "dots", cls: "calibration",
        label: "calibration", hollow: (p) => p[2] > 0 },
      { points: view.points.filter((p) => p.kind === "answer").map(point), kind: "dots", cls: "answer",
        label: "answer", hollow: (p) => p[2] > 0 },
    ],
  });
  $("profile-chart").replaceChildren(chart, legend([
    { label: "fitted prefill (nothing cached)", cls: "fit" }, { label: "predicted TTFT", cls: "ttft-curve" },
    { label: "calibration point", cls: "calibration" }, { label: "answer", cls: "answer" }]));
  const mape = view.fit.mape === null ? "" : `, error ${(view.fit.mape * 100).toFixed(1)} %`;
  // Said to a web user: what it is, not which command its server's operator would type.
  const quick = view.quick ? "; from a quick calibration (a full one can be measured on the server)" : "";
  $("profile-note").textContent = `${view.fit.form} form${mape}; overhead ${sec(view.overhead_s)}, ` +
    `safety ×${view.safety.toFixed(2)}${quick}. Hollow points had part of the prompt cached.`;
}

let resizing = null;
window.addEventListener("resize", () => {
  clearTimeout(resizing);
  resizing = setTimeout(() => {
    if (shownAnswer) showCosts(...shownAnswer);
    if (shownView) drawProfile(shownView);
  }, 150);
});
