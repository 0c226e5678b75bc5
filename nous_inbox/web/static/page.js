// The nous-inbox page: the session list, and a session's live events with the four ways to send.
// Every text from the server is written with textContent, never as HTML. The bearer token comes
// from the address's #token=... (then dropped from the address) or the token form, and is kept
// in this tab's sessionStorage only.
"use strict";

const root = document.body.dataset.root || "";
const $ = (id) => document.getElementById(id);
const SEND_MODE = { "next_step true": "steer", "next_step false": "inject",
                    "next_turn true": "followup", "next_turn false": "send(next_turn, no wake)" };

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

function short(text, limit = 100) {
  const flat = String(text).split(/\s+/).filter(Boolean).join(" ");
  return flat.length <= limit ? flat : flat.slice(0, limit - 1) + "…";
}

function args(a) {
  return Object.entries(a || {}).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ");
}

function body(e) {
  switch (e.type) {
    case "message_sent": {
      const mode = SEND_MODE[`${e.target} ${e.wakeup}`] || "send";
      return [[mode.padEnd(9), "send"], [` ${e.message.role}: ${short(e.message.content)}`]];
    }
    case "queue_claimed": return [[`claimed   ${e.count} from ${e.target}`, "claim"]];
    case "turn_started": return [[`turn ${e.turn} opened (${e.reason})`, "turn"]];
    case "step_started": return [[`  step ${e.step}`, "step"]];
    case "model_requested": return [[`  model    asked with ${e.count} messages`, "dim"]];
    case "model_replied": {
      const m = e.message;
      const calls = (m.tool_calls || []).map((c) => `${c.name}(${args(c.arguments)})`).join(", ");
      const text = m.content.trim() ? short(m.content, calls ? 100 : 500) : "";
      const parts = [text, calls ? "calls " + calls : ""].filter(Boolean);
      return [["  model    ", "model"], [parts.join(" · ") || "(empty reply)"]];
    }
    case "tool_called": return [["  tool     ", "tool"], [`${e.call.name}(${args(e.call.arguments)}) …`]];
    case "tool_returned": return [["  tool     ", "tool"], ["-> " + short(e.message.content, 80)]];
    case "step_ended": return [[`  step ${e.step} ended`, "dim"]];
    case "nudged": return [["  nudge    " + short(e.message.content), "dim"]];
    case "turn_ended": {
      const extra = e.error ? ": " + short(e.error, 200) : "";
      return [[`turn ${e.turn} ended after ${e.steps} step(s): ${e.reason}${extra}`,
               e.reason === "final" ? "final" : "warning"]];
    }
    case "warned": return [["warning  " + short(e.text, 200), "warning"]];
    default: return [[JSON.stringify(e)]];
  }
}

function render(e) {
  const line = el("li");
  line.dataset.seq = e.seq;
  line.dataset.type = e.type;
  line.append(el("span", `#${String(e.seq).padEnd(5)} `, "seq"));
  if (e.at) line.append(el("span", new Date(e.at * 1000).toTimeString().slice(0, 8) + " ", "time"));
  for (const [text, cls] of body(e)) line.append(el("span", text, cls));
  const list = $("events");
  const atEnd = list.scrollTop + list.clientHeight >= list.scrollHeight - 8;
  list.append(line);
  if (atEnd) list.scrollTop = list.scrollHeight;
}

// -- a session: its events, live, resumed from the last seq after a cut ------------------------

async function follow(id, onEvent) {
  let last = 0;
  for (;;) {
    try {
      const response = await api(`/sessions/${encodeURIComponent(id)}/events`,
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
          let seq = null, data = null;
          for (const line of block.split("\n")) {
            if (line.startsWith("id: ")) seq = Number(line.slice(4));
            else if (line.startsWith("data: ")) data = line.slice(6);
          }
          if (seq !== null && data !== null && seq > last) {
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
}

function showSession(id) {
  $("session-view").hidden = false;
  $("session-title").textContent = id;
  $("crumb").textContent = "/ " + id;
  document.title = id + " · nous-inbox";
  refreshStatus(id);
  follow(id, (e) => {
    render(e);
    if (statusTimer === null) statusTimer = setTimeout(() => refreshStatus(id), 200);
  });
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

async function showList() {
  $("list-view").hidden = false;
  $("open-form").onsubmit = (e) => {
    e.preventDefault();
    const name = $("open-name").value.trim();
    if (name) location.href = `${root}/sessions/${encodeURIComponent(name)}`;
  };
  for (;;) {
    const response = await api("/sessions");
    if (!response.ok) return;
    const { sessions } = await response.json();
    const list = $("sessions");
    list.textContent = "";
    for (const s of sessions) {
      const item = el("li");
      const link = el("a", s.id);
      link.href = `${root}/sessions/${encodeURIComponent(s.id)}`;
      item.append(link);
      if (s.hosted) item.append(el("span", "held here", "badge"));
      list.append(item);
    }
    $("no-sessions").hidden = sessions.length > 0;
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

const prefix = root + "/sessions/";
token();
if (location.pathname.startsWith(prefix)) showSession(decodeURIComponent(location.pathname.slice(prefix.length)));
else showList();
