// The fleet page: live workers and tenant usage, polled from GET /v1/fleet every second.
import { ApiError, el, getJson, signIn } from "./api.js";

const $ = (id) => document.getElementById(id);
const POLL_MS = 1000;

const pct = (x) => `${(100 * x).toFixed(0)}%`;
// 1234567 -> "1.2M": quotas run to millions of tokens a minute.
const compact = (n) => new Intl.NumberFormat("en", { notation: "compact", maximumFractionDigits: 1 }).format(n);

function meter(used, limit, text) {
  const share = limit > 0 ? Math.min(1, used / limit) : 0;
  const level = share > 0.9 ? "high" : share > 0.6 ? "mid" : "low";
  const fill = el("div", { class: `fill ${level}` });
  fill.style.width = `${(100 * share).toFixed(1)}%`; // CSSOM: the CSP forbids style attributes
  return el("div", { class: "meter" }, fill, el("span", {}, text ?? `${compact(Math.round(used))} of ${compact(limit)}`));
}

function partitions(list) {
  if (!list.length) return "none";
  const shown = list.length > 12 ? `${list.slice(0, 12).join(", ")} …` : list.join(", ");
  return el("span", { title: list.join(", ") }, `${list.length}: ${shown}`);
}

function workerRow(w) {
  return el("tr", { dataset: { worker: w.worker } },
    el("td", {}, w.worker), el("td", {}, w.pool), el("td", {}, w.engine), el("td", {}, w.role),
    el("td", {}, partitions(w.partitions)), el("td", { class: "num" }, w.running),
    el("td", { class: "num" }, w.waiting), el("td", { class: "num" }, w.queued),
    el("td", { class: "num" }, w.slots),
    el("td", {}, meter(w.kv_cache_usage, 1, pct(w.kv_cache_usage))),
    el("td", { class: "num" }, pct(w.prefix_hit_rate)),
    el("td", { class: "num" }, `${w.age.toFixed(1)} s ago`),
    el("td", {}, w.draining ? "draining" : "live"));
}

function tenantRow(t) {
  return el("tr", { dataset: { tenant: t.tenant, router: t.router } },
    el("td", {}, t.tenant), el("td", {}, t.router),
    el("td", {}, meter(t.input_used, t.itpm)), el("td", {}, meter(t.output_used, t.otpm)),
    el("td", { class: "num" }, `${t.inflight} / ${t.max_concurrency}`),
    el("td", { class: "num" }, `${t.queued} (${compact(t.queued_tokens)} tokens)`),
    el("td", { class: "num" }, `${t.oldest_wait.toFixed(1)} s`));
}

function render(status) {
  $("workers").tBodies[0].replaceChildren(...status.workers.map(workerRow));
  $("worker-count").textContent = `${status.workers.length} live`;
  const rows = status.tenants.map(tenantRow);
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 7, class: "muted" }, "no usage reported by a router yet")));
  $("tenants").tBodies[0].replaceChildren(...rows);
  $("tenant-scope").textContent = status.operator ? "every tenant (operator key)" : `tenant ${status.tenant} only`;
  $("updated").textContent = `Updated ${new Date(status.at * 1000).toLocaleTimeString()}.`;
  $("fleet-error").hidden = true;
}

async function poll() {
  try {
    render(await getJson("/v1/fleet"));
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) location.reload();
    $("fleet-error").textContent = `Could not refresh: ${err.message} (showing the last data).`;
    $("fleet-error").hidden = false;
  }
  setTimeout(poll, POLL_MS);
}

signIn((first) => {
  render(first);
  setTimeout(poll, POLL_MS);
});
