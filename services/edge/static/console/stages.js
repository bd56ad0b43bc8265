// One list item per stage event of /v1/sql/ask, in the order they arrive.
import { el } from "./api.js";

const TITLES = {
  cache: "Cache",
  verified: "Verified query",
  metric: "Metric",
  intent: "Intent",
  scope: "Tables chosen",
  sql: "SQL",
  validation: "Validation",
  explain: "Plan check (EXPLAIN)",
  rows: "Rows",
  retry: "Retry",
  clarify: "Clarification",
  summary: "Summary",
  chart: "Chart",
};

const tick = (ok) => el("span", { class: ok ? "tick ok" : "tick bad" }, ok ? "✓" : "✗");
const list = (items) => el("ul", {}, ...items.map((i) => el("li", {}, i)));
const seconds = (s) => (s >= 0.001 ? `${s.toFixed(s < 1 ? 3 : 1)} s` : "");

// Count from 0 to `to` in ~0.6 s: the counter runs while the rows arrive.
export function runCounter(node, to, suffix = " rows") {
  const start = performance.now();
  const step = (now) => {
    const done = Math.min(1, (now - start) / 600);
    node.textContent = `${Math.round(to * done)}${suffix}`;
    if (done < 1) requestAnimationFrame(step);
  };
  requestAnimationFrame(step);
}

function body(stage, d) {
  switch (stage) {
    case "cache":
      return el("p", {}, `${d.cache} cache hit`, d.score ? ` (similarity ${d.score})` : "",
        d.question ? ` for “${d.question}”` : "");
    case "verified":
      return el("p", {}, `Matched ${d.id} (score ${d.score}): “${d.question}”; its reviewed SQL is reused.`);
    case "metric":
      return el("p", {}, `Metric ${d.name} (score ${d.score})`,
        d.params && Object.keys(d.params).length ? ` with ${JSON.stringify(d.params)}` : "");
    case "intent":
      return el("p", {}, `${d.intent}`, d.overruled ? ` (the model said “${d.model_said}”, overruled: the question names your data)` : "");
    case "scope": {
      const why = d.mode === "full"
        ? "The whole schema fits the context; views ranked by relevance to the question."
        : "Only the views most relevant to the question, within the context budget.";
      return el("div", {}, el("p", { class: "tables" }, (d.views || []).join(", ")),
        el("p", { class: "muted" }, why),
        d.examples && d.examples.length ? el("p", { class: "muted" }, "Examples shown to the model: ", d.examples.join(" · ")) : null);
    }
    case "sql": {
      const from = d.source === "tenant" ? "your SQL" : d.source ? `from ${d.source}` : `attempt ${d.attempt}`;
      return el("div", {}, el("p", { class: "muted" }, from, d.finish === "length" ? " (cut off)" : ""),
        el("pre", { class: "sql" }, d.sql || ""));
    }
    case "validation":
      return el("div", {}, list([
        el("span", {}, tick(d.ok), d.ok ? " allowed by your tenant's SQL policy" : ` rejected by rule ${d.rule || "?"}`),
        d.ok ? el("span", {}, tick(true), " read-only, canonical, row limit enforced") : null,
        d.tables && d.tables.length ? el("span", {}, tick(d.ok), ` tables: ${d.tables.join(", ")}`) : null,
      ].filter(Boolean)));
    case "explain":
      return el("p", {}, tick(d.ok), d.ok ? ` plan accepted` : ` plan refused (${d.rule || "?"})`,
        d.rows_estimated != null ? `, about ${d.rows_estimated} rows scanned` : "");
    case "rows": {
      const counter = el("span", { class: "row-count" }, "0 rows");
      runCounter(counter, d.count || 0);
      return el("p", {}, tick(d.ok), " ", counter, d.truncated ? " (truncated)" : "",
        d.db_seconds != null ? ` in ${seconds(d.db_seconds)} in the database` : "",
        d.ok ? "" : ` refused (${d.rule || "?"})`);
    }
    case "retry":
      return el("p", {}, "Retrying once, told: ", el("q", {}, d.failure || ""));
    case "clarify":
      return el("p", {}, d.question || "", d.failure ? ` (${d.failure})` : "");
    case "summary":
      return el("p", {}, d.text || "(no summary)", d.source ? el("span", { class: "muted" },
        d.replaced ? " (template: the model's sentence stated what the facts do not)" : ` (${d.source})`) : "");
    case "chart":
      return el("p", {}, d.mark ? `${d.mark} chart` : "no chart for this shape");
    default:
      return el("pre", {}, JSON.stringify(d));
  }
}

export function stageItem(event) {
  const d = event.data || {};
  const failed = d.ok === false;
  return el("li", { class: `stage${failed ? " failed" : ""}`, dataset: { stage: event.stage } },
    el("div", { class: "stage-head" }, el("strong", {}, TITLES[event.stage] || event.stage),
      el("span", { class: "muted" }, seconds(event.seconds))),
    body(event.stage, d));
}
