// The inspector page: reads the worker's JSON views (docs/openapi.json) with the
// token kept in this tab's sessionStorage. Read-only; every value from the server
// is put into the page as text (textContent), never as HTML.
"use strict";

const TOKEN_KEY = "compactor.token";
const state = { conversation: null, tenant: null, historyCursor: null, ticket: 0 };

class Superseded extends Error {}

function current(ticket) {
  // A newer "Open" started meanwhile: this one's answers are dropped, not drawn.
  if (ticket !== state.ticket) throw new Superseded();
}

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) {
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
  }
  return node;
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

function showStatus(text, isError) {
  const box = $("status");
  box.hidden = !text;
  box.textContent = text || "";
  box.className = "status" + (isError ? " error" : "");
}

class ApiError extends Error {
  constructor(status, message) {
    super(`${status} ${message}`);
    this.status = status;
  }
}

async function api(path, params) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params || {})) {
    if (value !== null && value !== undefined && value !== "") query.set(name, value);
  }
  const url = path + (query.toString() ? "?" + query : "");
  const headers = { Accept: "application/json" };
  if (token()) headers.Authorization = "Bearer " + token();
  const response = await fetch(url, { headers, credentials: "omit", cache: "no-store" });
  let body = null;
  try {
    body = await response.json();
  } catch (_) {
    body = null;
  }
  if (!response.ok) {
    const why = body && body.error ? body.error : response.statusText;
    throw new ApiError(response.status, why);
  }
  return body;
}

function conversationPath(suffix) {
  return "/conversations/" + encodeURIComponent(state.conversation) + (suffix || "");
}

function tenantParams(extra) {
  return Object.assign({ tenant_id: state.tenant || null }, extra || {});
}

function when(iso) {
  if (!iso) return "";
  const date = new Date(iso);
  return date.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function renderMessage(message, isClip) {
  const item = el(
    "li",
    { class: `message role-${message.role}` + (isClip ? " clip" : "") + (message.pinned ? " pinned" : "") },
    el(
      "div",
      { class: "meta" },
      el("span", { class: "role", text: isClip ? "clip-archive" : message.role }),
      ...(message.pinned ? [el("span", { class: "pin", title: "pinned: kept verbatim by every compaction", text: "pinned" })] : []),
      el("span", { text: when(message.created_at) }),
      el("span", { text: message.id }),
    ),
    el("div", { class: "text", text: message.content }),
  );
  for (const call of message.tool_calls || []) {
    item.append(el("div", { class: "meta", text: `↳ tool call ${call.name}(${JSON.stringify(call.arguments)})` }));
  }
  return item;
}

function fact(list, name, value) {
  list.append(el("div", {}, el("dt", { text: name }), el("dd", { text: String(value) })));
}

// What a platform reading the context now is handed: as stored, or fitted at
// read time (a provisional clip-archive) until the compaction lands.
function contextFact(context) {
  const tokens = `${context.token_estimate} of ${context.budget} tokens`;
  if (!context.provisional) return `${tokens}, as stored`;
  const pending = context.pending_compaction ? ` until ${context.pending_compaction}` : "";
  return `${tokens}, provisional: ${context.folded_messages} messages folded${pending}`;
}

async function loadOverview(ticket) {
  const facts = $("overview-facts");
  $("overview-title").textContent =
    state.conversation + (state.tenant ? ` (tenant ${state.tenant})` : "");
  try {
    const status = await api(conversationPath(), tenantParams());
    current(ticket);
    facts.replaceChildren();
    fact(facts, "tokens", status.token_total);
    fact(facts, "budget", status.budget_tokens);
    fact(facts, "over budget", status.over_budget ? "yes" : "no");
    fact(facts, "messages counted", status.message_count);
    fact(facts, "compactions", status.compactions);
    fact(facts, "outstanding", status.compaction_outstanding || "none");
  } catch (error) {
    if (error.status === 401 || error instanceof Superseded) throw error;
    facts.replaceChildren();
    fact(facts, "tally", `not available here (${error.message})`);
  }
  try {
    const context = await api(conversationPath("/context"), tenantParams({ format: "messages" }));
    current(ticket);
    fact(facts, "handed to the model", contextFact(context));
  } catch (error) {
    if (error.status === 401 || error instanceof Superseded) throw error;
    fact(facts, "handed to the model", `not available (${error.message})`);
  }
}

async function loadHistory(more, ticket) {
  const list = $("history-list");
  const cursor = more ? state.historyCursor : null;
  const page = await api(conversationPath("/history"), tenantParams({ cursor }));
  current(ticket === undefined ? state.ticket : ticket);
  if (!more) list.replaceChildren();
  page.messages.forEach((message, index) => {
    const isClip = !more && index === 0 && page.clip_archive !== null;
    list.append(renderMessage(message, isClip));
  });
  state.historyCursor = page.next_cursor;
  $("history-more").hidden = !page.next_cursor;
  return page;
}

function renderChart(compactions) {
  const chart = $("compactions-chart");
  chart.replaceChildren();
  const most = Math.max(1, ...compactions.map((c) => c.tokens_before));
  for (const c of compactions) {
    const height = (tokens) => `${Math.max(2, Math.round((70 * tokens) / most))}px`;
    const before = el("div", { class: "bar before", title: `${c.tokens_before} tokens before` });
    const after = el("div", { class: "bar after", title: `${c.tokens_after} tokens after` });
    before.style.height = height(c.tokens_before);
    after.style.height = height(c.tokens_after);
    chart.append(el("div", { class: "pair" }, before, after));
  }
}

const KNOWN_COMPACTION_FIELDS = new Set([
  "compaction_id", "created_at", "messages_compressed", "batches_created",
  "tokens_before", "tokens_after", "batches", "usage", "strategies",
]);

function strategiesRun(strategies) {
  // Which strategies ran, in order, and the tokens each freed (issue 28).
  if (!strategies || !strategies.length) return "";
  return "strategies: " + strategies.map((s) => `${s.strategy} −${s.tokens_freed} (${s.messages} messages)`).join(" · ");
}

function spent(usage) {
  if (!usage) return "not recorded";
  const tokens = usage.input_tokens + usage.output_tokens + usage.cache_read_tokens + usage.cache_write_tokens;
  const cost = usage.cost_usd === null ? "no price" : `$${usage.cost_usd.toFixed(4)}`;
  const who = usage.model && usage.model !== usage.summarizer ? `${usage.summarizer} ${usage.model}` : usage.summarizer;
  return `${who} · ${usage.calls} calls · ${tokens} tokens · ${cost}` + (usage.fallback ? " · budget fallback" : "");
}

function extraFacts(record, known) {
  // Fields a newer worker adds (summariser, cost, usage…) are shown as they come.
  return Object.entries(record)
    .filter(([name, value]) => !known.has(name) && value !== null && value !== undefined)
    .map(([name, value]) => `${name}: ${typeof value === "object" ? JSON.stringify(value) : value}`)
    .join(", ");
}

async function loadCompactions(ticket) {
  const log = await api(conversationPath("/compactions"), tenantParams());
  current(ticket);
  const rows = $("compactions-table").querySelector("tbody");
  rows.replaceChildren();
  const batches = $("batch-list");
  batches.replaceChildren();
  for (const c of log.compactions) {
    rows.append(
      el(
        "tr",
        { "data-compaction": c.compaction_id },
        el("td", { text: when(c.created_at) }),
        el("td", { text: `${c.messages_compressed} → ${c.batches_created} batches` }),
        el("td", { text: `${c.tokens_before} → ${c.tokens_after}` }),
        el("td", { class: "usage", text: [spent(c.usage), strategiesRun(c.strategies), extraFacts(c, KNOWN_COMPACTION_FIELDS)].filter(Boolean).join(", ") }),
      ),
    );
    for (const batch of c.batches) batches.append(renderBatch(batch));
  }
  if (!log.compactions.length) {
    rows.append(el("tr", {}, el("td", { colspan: "4", class: "muted", text: "not compacted yet" })));
  }
  renderRejections(log.rejections || []);
  renderChart(log.compactions);
}

function renderRejections(rejections) {
  const list = $("rejections-list");
  list.replaceChildren();
  for (const r of rejections) {
    list.append(el("li", { class: "rejection", "data-compaction": r.compaction_id },
      el("span", { text: when(r.rejected_at) }),
      el("span", { class: "reason", text: r.reason }),
      el("span", { text: `${r.summarizer}: ${r.detail}` })));
  }
  if (!rejections.length) list.append(el("li", { class: "muted", text: "none refused" }));
}

function renderBatch(batch) {
  const item = el("li", { class: "batch" + (batch.superseded_by ? " superseded" : ""), "data-batch": batch.batch_id });
  const toggle = el("button", { type: "button", class: "link expand", text: "expand" });
  item.append(
    el(
      "div",
      { class: "head" },
      el("span", { class: "label", text: batch.label }),
      el("span", { class: "tag", text: `depth ${batch.depth}` }),
      el("span", { class: "tag", text: `${batch.message_count} messages` }),
      batch.superseded_by ? el("span", { class: "tag", text: `superseded by ${batch.superseded_by}` }) : null,
      el("span", { class: "muted", text: `${when(batch.start_time)} → ${when(batch.end_time)}` }),
      toggle,
    ),
  );
  toggle.addEventListener("click", () => expandBatch(item, batch.batch_id, toggle));
  return item;
}

const KNOWN_BATCH_FIELDS = new Set([
  "batch_id", "label", "conversation_id", "tenant_id", "depth", "start_time", "end_time",
  "message_count", "superseded_by", "summary", "turns", "turns_missing", "next_cursor",
  "specifics", "ledger",
]);

function renderSpecifics(title, specifics) {
  const box = el("div", { class: "specifics" }, el("h3", { text: title }));
  const list = el("ul", {});
  for (const s of specifics) {
    list.append(el("li", {}, el("span", { class: "tag", text: s.kind }), " ", s.text, " ", el("span", { class: "muted", text: s.message_id })));
  }
  box.append(list);
  return box;
}

async function expandBatch(item, batchId, toggle) {
  const open = item.querySelector(".detail");
  if (open) {
    open.remove();
    toggle.textContent = "expand";
    return;
  }
  const detail = el("div", { class: "detail" });
  item.append(detail);
  toggle.textContent = "collapse";
  let cursor = null;
  let first = true;
  try {
    do {
      const page = await api(
        conversationPath("/batches/" + encodeURIComponent(batchId)),
        tenantParams({ cursor }),
      );
      if (first) {
        detail.append(el("div", { class: "summary", text: page.summary }));
        if (page.ledger && page.ledger.length) {
          detail.append(renderSpecifics("Specifics the summary dropped (its ledger)", page.ledger));
        } else if (page.specifics && page.specifics.length) {
          detail.append(renderSpecifics("Specifics", page.specifics.slice(0, 12)));
        }
        const extra = Object.fromEntries(
          Object.entries(page).filter(([name, value]) => !KNOWN_BATCH_FIELDS.has(name) && value !== null),
        );
        if (Object.keys(extra).length) {
          // Specifics (issue 18) and any field a newer worker adds.
          detail.append(el("pre", { class: "extra", text: JSON.stringify(extra, null, 2) }));
        }
        detail.append(el("h3", { text: "Raw turns" }));
        if (page.turns_missing) {
          detail.append(el("p", { class: "muted", text: `${page.turns_missing} raw turns no longer archived (retention)` }));
        }
        first = false;
      }
      const turns = el("ol", { class: "messages turns" });
      for (const turn of page.turns) turns.append(renderMessage(turn, false));
      detail.append(turns);
      cursor = page.next_cursor;
    } while (cursor);
  } catch (error) {
    detail.append(el("p", { class: "status error", text: error.message }));
  }
}

async function search(event) {
  event.preventDefault();
  const results = $("search-results");
  results.replaceChildren();
  const scope = $("search-scope").value;
  const params = {
    q: $("query").value,
    sources: $("search-sources").value,
    tenant_id: state.tenant || null,
    conversation_id: scope === "conversation" ? state.conversation : null,
  };
  try {
    const found = await api("/memory/search", params);
    showStatus(`${found.hits.length} hit(s), ${found.mode.replace("_", " ")} search`, false);
    for (const hit of found.hits) {
      const item = el(
        "li",
        { class: "hit" },
        el(
          "div",
          { class: "meta" },
          el("strong", { text: hit.label }),
          " ",
          el("span", { class: "tag", text: `score ${hit.score.toFixed(4)}` }),
          " ",
          el("span", { class: "tag", text: hit.conversation_id }),
        ),
        el("div", { class: "text", text: hit.content }),
      );
      for (const turn of hit.turns) {
        item.append(el("div", { class: "turn", text: `${turn.role}: ${turn.text}` }));
      }
      results.append(item);
    }
    if (!found.hits.length) results.append(el("li", { class: "muted", text: "no matches" }));
  } catch (error) {
    showStatus(error.message, true);
  }
}

async function openConversation(event) {
  if (event) event.preventDefault();
  state.conversation = $("conversation").value.trim();
  state.tenant = $("tenant").value.trim() || null;
  if (!state.conversation) return;
  const url = new URL(location.href);
  url.hash = new URLSearchParams(
    Object.entries({ c: state.conversation, t: state.tenant || "" }).filter(([, v]) => v),
  ).toString();
  history.replaceState(null, "", url);
  showStatus("loading…", false);
  const ticket = ++state.ticket;
  try {
    await loadHistory(false, ticket);
    await loadOverview(ticket);
    await loadCompactions(ticket);
    $("search-results").replaceChildren();
    $("conversation-view").hidden = false;
    showStatus("", false);
  } catch (error) {
    if (error instanceof Superseded) return;
    $("conversation-view").hidden = true;
    const hint = error.status === 401 ? " (enter a valid token above)" : "";
    showStatus(error.message + hint, true);
  }
}

function showTokenState() {
  $("token-state").textContent = token() ? "token set for this tab" : "no token";
}

function start() {
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    showTokenState();
    if (state.conversation) openConversation(null);
  });
  $("token-forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showTokenState();
  });
  $("find-form").addEventListener("submit", openConversation);
  $("search-form").addEventListener("submit", search);
  $("history-more").addEventListener("click", () =>
    loadHistory(true).catch((error) => showStatus(error.message, true)),
  );
  showTokenState();
  const fromHash = new URLSearchParams(location.hash.slice(1));
  if (fromHash.get("c")) {
    $("conversation").value = fromHash.get("c");
    $("tenant").value = fromHash.get("t") || "";
    openConversation(null);
  }
}

document.addEventListener("DOMContentLoaded", start);
