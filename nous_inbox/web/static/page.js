// The nous-inbox page: the session list (each session's state, live), and a session's live
// events with the four ways to send, its queues and the model's view at each request.
// Every text from the server is written with textContent, never as HTML. The bearer token comes
// from the address's #token=... (then dropped from the address) or the token form, and is kept
// in this tab's sessionStorage only.
"use strict";

const root = document.body.dataset.root || "";
const $ = (id) => document.getElementById(id);
// What a stored send reads as: the first verb button (the server writes one per verb of its
// table) with the send's queue and wake, so a stored prompt reads as the followup it is stored as.
const SEND_MODE = {};
for (const button of document.querySelectorAll("button[data-mode]")) {
  const key = `${button.dataset.target} ${button.dataset.wakeup}`;
  if (!(key in SEND_MODE)) SEND_MODE[key] = button.dataset.mode;
}

function token() {
  const match = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (match) {
    sessionStorage.setItem("nous-inbox-token", decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem("nous-inbox-token") || "";
}

function askForToken() {
  const form = $("token-form");
  form.hidden = false;
  form.onsubmit = (e) => {
    e.preventDefault();
    sessionStorage.setItem("nous-inbox-token", $("token-input").value);
    location.reload();
  };
}

async function api(path, options = {}) {
  const headers = { Authorization: "Bearer " + token(), ...(options.headers || {}) };
  const response = await fetch(root + "/api" + path, { ...options, headers });
  if (response.status === 401) askForToken();
  return response;
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}

// -- one line per event, as `nous-inbox log` prints it ------------------------------------------

// Text from a log is shown as `nous-inbox log` shows it (nous_inbox.cli.terminal): controls as
// \x1b-style escapes and bidi controls as \u202e-style ones, so a message can neither hide in
// the page nor make a line read in another order than it is stored in.
const CONTROLS = /[\u0000-\u001f\u007f-\u009f]/g;
const BIDI = /[\u202a-\u202e\u2066-\u2069]/g;
// What Python's str.split() splits on, so a message flattens to the line the log prints.
const SPACES = /[\t\n\v\f\r\u001c-\u001f \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+/;
const hex = (c, n) => c.charCodeAt(0).toString(16).padStart(n, "0");

function printable(text) {
  return String(text).replace(CONTROLS, (c) => "\\x" + hex(c, 2)).replace(BIDI, (c) => "\\u" + hex(c, 4));
}

function short(text, limit = 100) {
  const flat = printable(String(text).split(SPACES).filter(Boolean).join(" "));
  return flat.length <= limit ? flat : flat.slice(0, limit - 1) + "…";
}

// A value as Python's json.dumps writes it: ", " and ": " between items, non-ASCII escaped.
function pyJson(v) {
  if (Array.isArray(v)) return "[" + v.map(pyJson).join(", ") + "]";
  if (v !== null && typeof v === "object") {
    return "{" + Object.entries(v).map(([k, x]) => `${pyJson(k)}: ${pyJson(x)}`).join(", ") + "}";
  }
  return JSON.stringify(v).replace(/[\u007f-\uffff]/g, (c) => "\\u" + hex(c, 4));
}

function args(a) {
  return Object.entries(a || {}).map(([k, v]) => `${printable(k)}=${pyJson(v)}`).join(", ");
}

function bodyText(body) {
  return typeof body === "string" ? body : JSON.stringify(body);
}

// One line per event type, as `nous-inbox log` prints it: the parts of the line, each
// [text, class]. Every type of the event vocabulary has its line here; tests/test_web_page.py
// reads these names and checks them against nous_inbox.events, so a new type cannot go unshown.
const LINES = {
  message_sent: (e) => {
    const mode = SEND_MODE[`${e.target} ${e.wakeup}`] || `send(${e.target}, ${e.wakeup ? "wakes" : "no wake"})`;
    return [[mode.padEnd(9), "send"], [` ${e.message.role}: ${short(e.message.content)}`]];
  },
  queue_claimed: (e) => [[`claimed   ${e.count} from ${e.target}`, "claim"]],
  message_withdrawn: (e) => [[`withdrawn the message sent at #${e.sent} from ${e.target}`, "send"]],
  turn_started: (e) => [[`turn ${e.turn} opened (${e.reason || "wake"})`, "turn"]],
  step_started: (e) => [[`  step ${e.step}`, "step"]],
  model_requested: (e) => [[`  model    asked with ${e.count} messages`, "dim"]],
  model_replied: (e) => {
    const m = e.message;
    const calls = (m.tool_calls || []).map((c) => `${c.name}(${args(c.arguments)})`).join(", ");
    const text = m.content.trim() ? short(m.content, calls ? 100 : 500) : "";
    const parts = [text, calls ? "calls " + calls : ""].filter(Boolean);
    return [["  model    ", "model"], [parts.join(" · ") || "(empty reply)"]];
  },
  tool_called: (e) => [["  tool     ", "tool"], [`${e.call.name}(${args(e.call.arguments)}) …`]],
  tool_returned: (e) => [["  tool     ", "tool"], ["-> " + short(e.message.content, 80)]],
  step_ended: (e) => [[`  step ${e.step} ended`, "dim"]],
  nudged: (e) => [["  nudge    " + short(e.message.content), "dim"]],
  turn_ended: (e) => {
    const extra = e.error ? ": " + short(e.error, 200) : "";
    return [[`turn ${e.turn} ended after ${e.steps} step(s): ${e.reason}${extra}`,
             e.reason === "final" ? "final" : "warning"]];
  },
  warned: (e) => [["warning  " + short(e.text, 200), "warning"]],
  cancel_requested: (e) => [[`cancel of turn ${e.turn} asked`, "warning"]],
  session_released: (e) => [[`released by its holder${e.turn ? `, turn ${e.turn} to be carried on` : ""}`, "warning"]],
  mail_sent: (e) => {
    const kind = (e.kind || "action") + (e.reply_to ? `, re ${e.reply_to}` : "");
    return [["mail     ", "mail"], [` ${e.id} ${e.sender} -> ${e.recipient} (${kind}): ${short(bodyText(e.body))}`]];
  },
  mail_dropped: (e) => [["mail     ", "mail"], [` ${e.id} to ${e.recipient} dropped to make room`]],
  mail_received: (e) => [["mail     ", "mail"], [` ${e.recipient} received ${e.ids.join(", ")}`]],
  mail_noticed: (e) => [["mail     ", "mail"], [` notice ${e.notice} to ${e.recipient}: ${e.ids.join(", ")}`]],
  mail_read: (e) => [["mail     ", "mail"], [` ${e.recipient} read ${e.ids.join(", ")}`]],
  mail_answered: (e) => [["mail     ", "mail"], [` ${e.ids.join(", ")} to ${e.recipient} answered by ${e.by}`]],
  mail_withdrawn: (e) => [["mail     ", "mail"], [` ${e.id} to ${e.recipient} ${e.retracted ? "retracted" : "withdrawn"}`]],
  mail_agent: (e) => [["agent    ", "mail"], [` ${e.agent}${e.parent ? " under " + e.parent : ""}${e.worked ? " has worked" : ""}`]],
};

function body(e) {
  if (Object.hasOwn(LINES, e.type)) return LINES[e.type](e);
  // The server sends only the types it knows, and serves this page with them: this is a page
  // older than its server (a cached copy), which should say so rather than guess.
  return [[`${e.type}: an event type this page does not know; reload it`, "warning"]];
}

function render(e) {
  const line = el("li");
  line.dataset.seq = e.seq;
  line.dataset.type = e.type;
  line.append(el("span", `#${String(e.seq).padEnd(5)} `, "seq"));
  if (e.at) line.append(el("span", new Date(e.at * 1000).toTimeString().slice(0, 8) + " ", "time"));
  for (const [text, cls] of body(e)) line.append(el("span", printable(text), cls));
  if (e.type === "model_requested") line.append(viewButton(e));
  const list = $("events");
  const atEnd = list.scrollTop + list.clientHeight >= list.scrollHeight - 8;
  list.append(line);
  if (atEnd) list.scrollTop = list.scrollHeight;
}

// -- a session: its events, live, resumed from the last seq after a cut ------------------------

// The model's words as it writes them: one live line per reply, grown by each delta, and
// replaced by the reply's own line once it is logged (a delta is never stored: after a cut the
// page reads the logged events only).
function liveLine(delta) {
  const key = `${delta.turn}/${delta.step}`;
  let line = document.querySelector(`#events li.live[data-key="${key}"]`);
  if (!line) {
    line = el("li", undefined, "live");
    line.dataset.type = "text_delta";
    line.dataset.key = key;
    line.append(el("span", "       ", "seq"), el("span", "  model    ", "model"), el("span", ""));
    $("events").append(line);
  }
  return line;
}

const liveText = new Map();  // a live line's key -> the reply's text so far

function showDelta(delta) {
  const line = liveLine(delta);
  const raw = (liveText.get(line.dataset.key) || "") + delta.text;
  liveText.set(line.dataset.key, raw);
  // Flattened as the reply's logged line is; a long reply shows its newest words.
  const flat = printable(raw.split(SPACES).filter(Boolean).join(" "));
  line.lastChild.textContent = (flat.length > 500 ? "…" + flat.slice(-499) : flat) + " ▍";
  const list = $("events");
  if (list.scrollTop + list.clientHeight >= list.scrollHeight - 40) list.scrollTop = list.scrollHeight;
}

function endLive(e) {
  // The reply is logged (or its turn ended without one: cancelled, failed): its live line goes.
  const lines = document.querySelectorAll("#events li.live");
  for (const line of lines) {
    if (e.type === "turn_ended" || line.dataset.key === `${e.turn}/${e.step}`) {
      liveText.delete(line.dataset.key);
      line.remove();
    }
  }
}

async function follow(id, onEvent, onDelta) {
  let last = 0;
  for (;;) {
    try {
      const response = await api(`/sessions/${encodeURIComponent(id)}/events?deltas=1`,
                                 { headers: { "Last-Event-ID": String(last) } });
      if (response.status === 401) return;
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          let seq = null, data = null, kind = null;
          for (const line of block.split("\n")) {
            if (line.startsWith("id: ")) seq = Number(line.slice(4));
            else if (line.startsWith("data: ")) data = line.slice(6);
            else if (line.startsWith("event: ")) kind = line.slice(7);
          }
          if (kind === "delta" && data !== null) {
            onDelta(JSON.parse(data));
          } else if (seq !== null && data !== null && seq > last) {
            last = seq;
            onEvent(JSON.parse(data));
          }
        }
      }
    } catch (error) {
      // the server went away or the connection dropped: try again from the last seq
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

// -- receipts: each send marked queued, delivered (which turn and step) or withdrawn ------------
// Where a send went is the server's answer (GET .../messages/{seq}, nous_inbox.receipts): the page
// asks it for the sends still marked queued whenever a claim or a withdraw is recorded.

const queuedSends = new Map();  // seq -> the mark on its line, while it is queued
let receiptTimer = null;

function receiptText(r) {
  if (r.state === "claimed") return r.turn ? `delivered: turn ${r.turn}, step ${r.step}` : "delivered";
  return r.state;
}

function showReceipt(mark, r) {
  mark.textContent = "";
  mark.className = "receipt " + r.state;
  mark.append(el("span", ` [${receiptText(r)}]`));
  if (r.state !== "queued") {
    queuedSends.delete(r.sent);
    return;
  }
  const button = el("button", "withdraw", "withdraw");
  button.type = "button";
  button.onclick = async () => {
    const response = await api(`/sessions/${encodeURIComponent(mark.dataset.session)}/messages/${r.sent}/withdraw`,
                               { method: "POST" });
    if (response.ok) showReceipt(mark, await response.json());
  };
  mark.append(button);
}

async function refreshReceipts(id) {
  receiptTimer = null;
  for (const [seq, mark] of [...queuedSends]) {
    const response = await api(`/sessions/${encodeURIComponent(id)}/messages/${seq}`);
    if (response.ok) showReceipt(mark, await response.json());
  }
}

function markReceipt(id, e) {
  if (e.type === "message_sent") {
    const mark = el("span", undefined, "receipt queued");
    mark.dataset.session = id;
    $("events").lastElementChild.append(mark);
    queuedSends.set(e.seq, mark);
    showReceipt(mark, { sent: e.seq, state: "queued" });
  } else if ((e.type === "queue_claimed" || e.type === "message_withdrawn") && receiptTimer === null) {
    receiptTimer = setTimeout(() => refreshReceipts(id), 200);
  }
}

// -- the model's view at a request: the first `count` messages of the transcript ---------------
// (the transcript only grows, so they are what the model was asked with), from the server.

const VIEW_PAGE = 200;  // the newest messages of a long view: the ones the model read last

// A message's text as the log writes it, its line breaks kept: each line escaped as a line.
function fullText(text) {
  return String(text).split("\n").map(printable).join("\n");
}

function viewButton(e) {
  const actions = el("span", undefined, "actions");
  const button = el("button", "view", "view");
  button.type = "button";
  button.title = "what the model was shown at this request";
  button.onclick = () => showView(e);
  actions.append(button);
  return actions;
}

async function showView(e) {
  const id = $("session-title").textContent;
  const offset = Math.max(0, e.count - VIEW_PAGE);
  const response = await api(`/sessions/${encodeURIComponent(id)}/view/${e.seq}?offset=${offset}&limit=${VIEW_PAGE}`);
  const answer = await response.json().catch(() => ({}));
  const panel = $("view");
  const list = $("view-messages");
  list.textContent = "";
  panel.hidden = false;
  $("view-close").onclick = () => { panel.hidden = true; };
  if (!response.ok) {
    $("view-title").textContent = `The model's view at #${e.seq}`;
    $("view-note").textContent = answer.error || response.statusText;
    return;
  }
  $("view-title").textContent = `What the model was shown at #${answer.seq}: turn ${answer.turn}, step ${answer.step}`;
  $("view-note").textContent = `${answer.count} message(s)` +
    (answer.offset ? `; the first ${answer.offset} not shown, the last ${answer.messages.length} below` : "");
  answer.messages.forEach((m, i) => {
    const item = el("li");
    item.dataset.role = m.role;
    item.append(el("span", `${answer.offset + i + 1}. ${m.role}` + (m.tool_call_id ? ` (${printable(m.tool_call_id)})` : ""), "role"));
    if (m.content) item.append(el("div", fullText(m.content), "content"));
    for (const c of m.tool_calls || []) item.append(el("div", `calls ${printable(c.name)}(${args(c.arguments)})`, "calls"));
    list.append(item);
  });
  panel.scrollIntoView({ block: "nearest" });
}

// -- the queues: each waiting message, with its seq, whether it wakes, and a withdraw ----------

function showQueue(id, target, count, entries) {
  $("count-" + target).textContent = `(${count})`;
  const list = $("queue-" + target);
  list.textContent = "";
  for (const entry of entries) {
    const item = el("li");
    item.dataset.seq = entry.seq;
    item.append(el("span", `#${entry.seq} `, "seq"));
    item.append(el("span", short(entry.message.content, 200), "text"));
    item.append(el("span", entry.wakeup ? " · wakes" : " · wakes nothing", "wake"));
    const button = el("button", "withdraw", "withdraw");
    button.type = "button";
    button.onclick = async () => {
      const response = await api(`/sessions/${encodeURIComponent(id)}/messages/${entry.seq}/withdraw`,
                                 { method: "POST" });
      if (response.ok) refreshStatus(id);
    };
    item.append(button);
    list.append(item);
  }
  if (count > entries.length) list.append(el("li", `… and ${count - entries.length} more`, "more"));
}

let statusTimer = null;

async function refreshStatus(id) {
  statusTimer = null;
  const response = await api(`/sessions/${encodeURIComponent(id)}?limit=0`);
  const status = $("status");
  if (!response.ok) {
    status.textContent = response.status === 404 ? "new session: send a prompt to start it" : "";
    return;
  }
  const s = await response.json();
  status.textContent = "";
  status.append(el("span", s.running ? "running" : "idle", s.running ? "running" : ""));
  status.append(` · turn ${s.turn} · step ${s.step} · queued: ${s.inbox.next_step} next step, ` +
                `${s.inbox.next_turn} next turn · ${s.transcript_length} messages · event #${s.version}` +
                (s.hosted ? " · held here" : " · held elsewhere"));
  showQueue(id, "next_step", s.inbox.next_step, s.queued.next_step);
  showQueue(id, "next_turn", s.inbox.next_turn, s.queued.next_turn);
}

function showSession(id) {
  $("session-view").hidden = false;
  $("session-title").textContent = id;
  $("crumb").textContent = "/ " + id;
  document.title = id + " · nous-inbox";
  refreshStatus(id);
  follow(id, (e) => {
    if (e.type === "model_replied" || e.type === "turn_ended") endLive(e);
    render(e);
    markReceipt(id, e);
    if (statusTimer === null) statusTimer = setTimeout(() => refreshStatus(id), 200);
  }, showDelta);
  const text = $("text");
  const sent = $("sent");
  async function send(mode) {
    if (!text.value.trim()) { text.focus(); return; }
    const response = await api(`/sessions/${encodeURIComponent(id)}/messages`, {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ mode, text: text.value }),
    });
    const answer = await response.json().catch(() => ({}));
    sent.className = response.ok ? "" : "error";
    sent.textContent = response.ok ? `${mode} stored as event #${answer.seq}` : (answer.error || response.statusText);
    if (response.ok) text.value = "";
  }
  for (const button of document.querySelectorAll("button[data-mode]")) {
    button.onclick = () => send(button.dataset.mode);
  }
  text.onkeydown = (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); send("steer"); } };
  $("send-form").onsubmit = (e) => e.preventDefault();
  $("cancel").onclick = async () => {
    const response = await api(`/sessions/${encodeURIComponent(id)}/cancel`, { method: "POST" });
    const answer = await response.json().catch(() => ({}));
    sent.className = response.ok ? "" : "error";
    sent.textContent = response.ok ? (answer.cancelled ? "cancelled the run" : "no run to cancel here")
                                   : (answer.error || response.statusText);
  };
}

// -- the list ----------------------------------------------------------------------------------

const LIST_PAGE = 50;
const listState = { offset: 0, prefix: "", timer: null, asked: 0 };

function held(s) {
  if (s.hosted) return "here";
  if (!s.state) return "not read here";
  return s.state.running ? "elsewhere" : "not here";
}

function sessionRow(s) {
  const row = el("tr");
  row.dataset.id = s.id;
  const name = el("td");
  const link = el("a", printable(s.id));
  link.href = `${root}/sessions/${encodeURIComponent(s.id)}`;
  name.append(link);
  row.append(name);
  const st = s.state;
  const cells = st ? [st.running ? "running" : "idle", st.turn, st.step, st.inbox.next_step, st.inbox.next_turn]
                   : ["—", "", "", "", ""];
  cells.forEach((text, i) => row.append(el("td", String(text), i === 0 && st && st.running ? "running" : "")));
  row.append(el("td", held(s), s.hosted ? "badge" : "dim"));
  return row;
}

async function refreshList() {
  clearTimeout(listState.timer);
  const asked = ++listState.asked;
  const query = `?offset=${listState.offset}&limit=${LIST_PAGE}&prefix=${encodeURIComponent(listState.prefix)}`;
  const response = await api("/sessions" + query);
  // A newer ask (a filter typed, a page turned) answers for the page; this one is stale.
  if (response.status === 401 || asked !== listState.asked) return;
  if (response.ok) {
    const { sessions, total, offset } = await response.json();
    const body = $("sessions");
    body.textContent = "";
    for (const s of sessions) body.append(sessionRow(s));
    $("no-sessions").hidden = total > 0 || listState.prefix !== "";
    $("list-range").textContent = total ? `${offset + 1}–${offset + sessions.length} of ${total}` : "none";
    $("list-prev").disabled = offset === 0;
    $("list-next").disabled = offset + sessions.length >= total;
  } else {
    const answer = await response.json().catch(() => ({}));
    $("list-range").textContent = answer.error || response.statusText;
  }
  listState.timer = setTimeout(refreshList, 3000);  // live: each held session's state as it runs
}

function showList() {
  $("list-view").hidden = false;
  $("open-form").onsubmit = (e) => {
    e.preventDefault();
    const name = $("open-name").value.trim();
    if (name) location.href = `${root}/sessions/${encodeURIComponent(name)}`;
  };
  $("filter-form").onsubmit = (e) => e.preventDefault();
  $("filter").oninput = () => { listState.prefix = $("filter").value; listState.offset = 0; refreshList(); };
  $("list-prev").onclick = () => { listState.offset = Math.max(0, listState.offset - LIST_PAGE); refreshList(); };
  $("list-next").onclick = () => { listState.offset += LIST_PAGE; refreshList(); };
  refreshList();
}

const prefix = root + "/sessions/";
token();
if (location.pathname.startsWith(prefix)) showSession(decodeURIComponent(location.pathname.slice(prefix.length)));
else showList();
