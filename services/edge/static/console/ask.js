// The ask page: a question (or SQL to fix) in, its stages streamed out as they happen,
// then the rows, summary and chart; rejections and clarifications shown in the page.
import { ApiError, el, postJson, signIn, streamEvents } from "./api.js";
import { renderChart } from "./chart.js";
import { runCounter, stageItem } from "./stages.js";

const $ = (id) => document.getElementById(id);
const ROW_CHUNK = 200; // rows appended per animation frame: the counter runs with them

let running = null; // the AbortController of the question in flight
let lastAnswer = null;
let lastQuestion = ""; // the answer body does not repeat the question

function reset() {
  for (const id of ["rejection", "error", "clarification", "result", "summary", "facts", "chart", "final-sql"]) $(id).hidden = true;
  $("stages").replaceChildren();
  $("rejection").replaceChildren();
  $("error").replaceChildren();
  $("result-table").tHead.replaceChildren();
  $("result-table").tBodies[0].replaceChildren();
  $("row-counter").textContent = "0 rows";
  $("review-button").disabled = true;
  $("review-status").textContent = "";
  $("progress").hidden = false;
  lastAnswer = null;
}

function setStatus(text) {
  $("status").textContent = text;
}

function reject(title, detail) {
  const box = $("rejection");
  if (box.hidden) box.append(el("h2", {}, "Rejected"));
  box.append(el("p", { class: "reason" }, title), detail ? el("p", { class: "muted" }, detail) : "");
  box.hidden = false;
}

function showError(error, retryAfter) {
  if (error.code === "rejected_sql") {
    reject(error.message, error.request_id ? `request ${error.request_id}` : "");
    setStatus("rejected");
    return;
  }
  const box = $("error");
  box.replaceChildren(el("h2", {}, error.code === "over_quota" ? "Over quota" : "Not answered"),
    el("p", {}, error.message || "unknown error"),
    retryAfter || error.code === "over_quota" ? el("p", { class: "muted" }, `Try again in ${retryAfter || "a few"} s.`) : "",
    error.request_id ? el("p", { class: "muted" }, `request ${error.request_id} · ${error.code || error.type}`) : "");
  box.hidden = false;
  setStatus("failed");
}

function onStage(event) {
  $("stages").append(stageItem(event));
  const d = event.data || {};
  if (event.stage === "validation" && d.ok === false) {
    reject(`The SQL guard refused the statement (rule ${d.rule || "unknown"}).`, "Nothing was run.");
  } else if (event.stage === "explain" && d.ok === false) {
    reject(`The plan check refused the statement (rule ${d.rule || "unknown"}).`, "Nothing was run.");
  } else if (event.stage === "retry" && !$("rejection").hidden) {
    $("rejection").append(el("p", { class: "muted" }, `Why: ${d.failure}. Trying once more with that information.`));
  }
  setStatus(`… ${event.stage}`);
}

function clarify(c) {
  $("clarify-question").textContent = c.question;
  $("choices").replaceChildren(...(c.options || []).map((option) => {
    const b = el("button", { type: "button", class: "choice" }, option);
    b.addEventListener("click", () => {
      if (option.startsWith("None of these")) {
        $("question").focus();
        return;
      }
      $("question").value = option;
      ask({ question: option });
    });
    return b;
  }));
  $("clarification").hidden = false;
}

function fillTable(columns, rows, truncated) {
  const table = $("result-table");
  table.tHead.replaceChildren(el("tr", {}, ...columns.map((c) => el("th", {}, c))));
  const tbody = table.tBodies[0];
  let i = 0;
  const more = () => {
    const end = Math.min(rows.length, i + ROW_CHUNK);
    for (; i < end; i++) tbody.append(el("tr", {}, ...rows[i].map((v) => el("td", { class: typeof v === "number" ? "num" : "" }, v === null ? "∅" : String(v)))));
    $("row-counter").textContent = `${i}${i < rows.length ? " …" : ""} rows${truncated && i === rows.length ? " (truncated)" : ""}`;
    if (i < rows.length) requestAnimationFrame(more);
    else table.dataset.complete = "true";
  };
  table.dataset.complete = "false";
  more();
}

// The result's facts (computed from the rows, no model): what the summary may state.
function factLines(f) {
  if (!f) return [];
  const point = (p) => (p ? `${p.value ?? "NULL"} on ${p.label}` : "");
  const lines = [`${f.kind}: ${f.row_count} row${f.row_count === 1 ? "" : "s"}${f.truncated ? " (truncated)" : ""}`];
  for (const v of f.values || []) lines.push(`${v.label} = ${v.value ?? "NULL"}`);
  if (f.kind === "series") {
    lines.push(`${f.measure}: first ${point(f.first)}, last ${point(f.last)}` +
      (f.change != null ? `, change ${f.change}${f.change_pct != null ? ` (${f.change_pct}%)` : ""}` : ""));
    lines.push(`high ${point(f.high)}, low ${point(f.low)}`);
  }
  for (const s of f.top || []) lines.push(`${s.label}: ${s.value}${s.share != null ? ` (${s.share}%)` : ""}`);
  if (f.total != null) lines.push(`total ${f.measure}: ${f.total}`);
  return lines;
}

function onAnswer(answer) {
  lastAnswer = answer;
  setStatus(`${answer.status} · ${answer.path} · ${answer.duration.toFixed(2)} s`);
  if (answer.error && answer.status !== "clarify") showError({ ...answer.error, request_id: answer.request_id });
  if (answer.clarification) clarify(answer.clarification);
  if (answer.status !== "ok") return;
  $("result").hidden = false;
  if (answer.summary) {
    $("summary").textContent = answer.summary;
    $("summary").title = answer.summary_source === "model" ? "rephrased by the model, checked against the facts" : "written from the facts";
    $("summary").hidden = false;
  }
  const facts = factLines(answer.facts);
  if (facts.length) {
    $("facts").replaceChildren(...facts.map((line) => el("li", {}, line)));
    $("facts").hidden = false;
  }
  if (answer.sql) {
    $("final-sql").textContent = answer.sql;
    $("final-sql").hidden = false;
    $("review-button").disabled = false;
  }
  if (answer.chart) {
    renderChart(answer.chart, $("chart")); // says so in the box when it cannot draw it
    $("chart").hidden = false;
  }
  if (answer.columns.length) fillTable(answer.columns, answer.rows, answer.truncated);
  else runCounter($("row-counter"), 0);
}

async function ask({ question, sql }) {
  if (running) running.abort();
  const controller = (running = new AbortController());
  reset();
  lastQuestion = question;
  setStatus("asking …");
  const body = { question, stream: true, no_cache: $("no-cache").checked };
  if (sql) body.sql = sql;
  try {
    for await (const event of streamEvents("/v1/sql/ask", body, controller.signal)) {
      if (event === "[DONE]") break;
      if (event.type === "stage") onStage(event);
      else if (event.type === "answer") onAnswer(event);
      else if (event.type === "error") showError(event.error);
    }
  } catch (err) {
    if (controller.signal.aborted) return;
    if (err instanceof ApiError) showError(err.error, err.retryAfter);
    else showError({ message: `the connection failed: ${err.message}`, type: "network" });
  } finally {
    if (running === controller) running = null;
  }
}

async function requestReview() {
  if (!lastAnswer || !lastAnswer.sql) return;
  $("review-button").disabled = true;
  try {
    const queued = await postJson("/v1/sql/review", {
      question: lastQuestion,
      sql: lastAnswer.sql, request_id: lastAnswer.request_id,
    });
    $("review-status").textContent = `Review requested (${queued.review_id}).`;
  } catch (err) {
    $("review-status").textContent = `Review request failed: ${err.message}`;
    $("review-button").disabled = false;
  }
}

signIn(() => {
  $("ask-form").addEventListener("submit", (event) => {
    event.preventDefault();
    ask({ question: $("question").value.trim() });
  });
  $("fix-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const meant = $("question").value.trim() || "Check and fix this SQL.";
    ask({ question: meant, sql: $("fix-sql").value.trim() });
  });
  $("review-button").addEventListener("click", requestReview);
});
