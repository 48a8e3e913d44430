// The chat page: firsttoken's websocket protocol (README, "The websocket protocol (v1)") in a
// browser. No build step and nothing fetched from elsewhere, so the page works offline.
"use strict";

(() => {
  const KEY_STORAGE = "firsttoken.apiKey";
  // Reconnect backoff while answers are running; a socket with nothing running is reopened
  // only when the next question is sent.
  const RECONNECT_MS = [250, 500, 1000, 2000, 4000];
  // Drafts (issue 34): the question as typed, this long after the last keystroke, so the
  // engine has its prompt prefilled when it is sent (README, "Drafts"). Never answered.
  const DRAFT_DEBOUNCE_MS = 300;

  const $ = (id) => document.getElementById(id);
  const ui = {
    conn: $("conn"),
    key: $("key"),
    saveKey: $("save-key"),
    forgetKey: $("forget-key"),
    model: $("model"),
    maxTokens: $("max-tokens"),
    notice: $("notice"),
    chats: $("chats"),
    form: $("ask"),
    question: $("question"),
    template: $("chat-template"),
  };

  /** Every chat of this page by its id: {id, jobId, lastSeq, sentAt, firstAt, running, el}. */
  const chats = new Map();
  let ws = null;
  let opening = null; // the promise of a socket being opened
  let attempt = 0;
  let reconnectTimer = null;
  let refused = false; // the gateway closed with 1008 (bad key): no reconnect until a new key
  let counter = 0;
  let draftTimer = null;
  let draftSent = ""; // the text of the last draft sent, so an unchanged one is not resent

  // --- small helpers -----------------------------------------------------------------------
  function apiKey() {
    return sessionStorage.getItem(KEY_STORAGE) || "";
  }

  function notice(text) {
    ui.notice.textContent = text || "";
    ui.notice.hidden = !text;
  }

  function connState(state, text) {
    ui.conn.dataset.state = state;
    ui.conn.textContent = text;
  }

  function badge(chat, name, text) {
    const el = chat.el.querySelector("." + name);
    if (text === null) {
      el.hidden = true;
    } else {
      el.textContent = text;
      el.hidden = false;
    }
  }

  function setState(chat, state, text) {
    chat.el.dataset.state = state;
    badge(chat, "state", text || state);
    chat.running = state === "waiting" || state === "streaming";
    chat.el.querySelector(".stop").disabled = !chat.running;
  }

  function ms(value) {
    return value < 10 ? value.toFixed(1) : String(Math.round(value));
  }

  // --- the API key and the model list ------------------------------------------------------
  async function loadModels() {
    const key = apiKey();
    if (!key) return;
    let body;
    try {
      const resp = await fetch("/v1/models", { headers: { Authorization: "Bearer " + key } });
      body = await resp.json();
      if (!resp.ok) {
        const message = (body.error && body.error.message) || resp.statusText;
        notice("The gateway refused this API key: " + message);
        return;
      }
    } catch (err) {
      notice("Could not list the models: " + err);
      return;
    }
    const chosen = ui.model.value;
    ui.model.replaceChildren(new Option("auto", "auto"));
    let preferred = "auto";
    for (const model of body.data || []) {
      ui.model.add(new Option(model.id, model.id));
      if (model.default) preferred = model.id;
    }
    const ids = Array.from(ui.model.options, (o) => o.value);
    ui.model.value = ids.includes(chosen) && chosen !== "auto" ? chosen : preferred;
    notice("");
  }

  function useKey() {
    const key = ui.key.value.trim();
    if (!key) {
      notice("Enter an API key (`firsttoken keys create --tenant NAME` prints one).");
      return;
    }
    sessionStorage.setItem(KEY_STORAGE, key);
    refused = false;
    if (ws) ws.close(1000, "new key"); // the socket is authenticated with the old key
    loadModels();
  }

  function forgetKey() {
    sessionStorage.removeItem(KEY_STORAGE);
    ui.key.value = "";
    if (ws) ws.close(1000, "key forgotten");
  }

  // --- the socket --------------------------------------------------------------------------
  function socketUrl() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    // Browsers cannot set headers on a websocket; the gateway also reads ?api_key=.
    return `${scheme}//${location.host}/v1/ws?api_key=${encodeURIComponent(apiKey())}`;
  }

  function ensureSocket() {
    if (ws && ws.readyState === WebSocket.OPEN) return Promise.resolve(ws);
    if (opening) return opening;
    opening = new Promise((resolve, reject) => {
      connState("connecting", "connecting…");
      const sock = new WebSocket(socketUrl());
      let opened = false;
      sock.onopen = () => {
        opened = true;
        ws = sock;
        opening = null;
        attempt = 0;
        connState("open", "connected");
        resumeRunning();
        resolve(sock);
      };
      sock.onmessage = (event) => onFrame(event.data);
      sock.onclose = (event) => {
        if (!opened) {
          opening = null;
          reject(new Error("the websocket could not be opened"));
        }
        if (ws === sock) ws = null;
        onClosed(event);
      };
    });
    return opening;
  }

  function onClosed(event) {
    const running = [...chats.values()].some((c) => c.running);
    if (event.code === 1008) {
      refused = true;
      connState("refused", "refused");
    } else if (running) {
      connState("closed", "disconnected");
    } else {
      // Nothing lost (the gateway closes idle sockets, or a new key was entered): the next
      // question opens a new socket.
      connState("idle", "not connected");
    }
    // Chats the gateway never accepted cannot be resumed: they have no job id.
    for (const chat of chats.values()) {
      if (chat.running && !chat.jobId) {
        setState(chat, "failed", "connection lost");
      }
    }
    const resumable = [...chats.values()].some((c) => c.running && c.jobId);
    if (resumable && !refused && reconnectTimer === null) {
      const delay = RECONNECT_MS[Math.min(attempt, RECONNECT_MS.length - 1)];
      attempt += 1;
      connState("connecting", `reconnecting in ${delay} ms…`);
      reconnectTimer = setTimeout(() => {
        reconnectTimer = null;
        // A failed attempt closes the socket, whose onclose schedules the next one.
        ensureSocket().catch(() => {});
      }, delay);
    } else if (refused) {
      for (const chat of chats.values()) {
        if (chat.running) setState(chat, "failed", "unauthorized");
      }
    }
  }

  /** After a reconnect: ask for every running answer again from the last token shown. */
  function resumeRunning() {
    for (const chat of chats.values()) {
      if (chat.running && chat.jobId) {
        chat.resumed = true;
        send({ type: "resume", id: chat.id, job_id: chat.jobId, after_seq: chat.lastSeq });
      }
    }
  }

  function send(frame) {
    ws.send(JSON.stringify(frame));
  }

  // --- frames from the gateway -------------------------------------------------------------
  function onFrame(raw) {
    let frame;
    try {
      frame = JSON.parse(raw);
    } catch {
      return;
    }
    const chat = frame.id == null ? null : chats.get(frame.id);
    if (!chat) {
      const idle = frame.code === "timeout" && ![...chats.values()].some((c) => c.running);
      if (frame.type === "error" && !idle) notice(`${frame.code}: ${frame.message}`);
      return;
    }
    switch (frame.type) {
      case "accepted":
        chat.jobId = frame.job_id;
        chat.el.dataset.jobId = frame.job_id;
        break;
      case "token":
        // A resumed answer may repeat what was already shown; seq says what is new.
        if (frame.seq <= chat.lastSeq) break;
        chat.lastSeq = frame.seq;
        appendText(chat, frame.text);
        if (chat.firstAt === null) {
          chat.firstAt = performance.now();
          badge(chat, "ttft", `TTFT ${ms(chat.firstAt - chat.sentAt)} ms`);
          setState(chat, "streaming");
        }
        break;
      case "done":
        onDone(chat, frame);
        break;
      case "error":
        if (frame.code === "cancelled") {
          setState(chat, "stopped");
        } else {
          setState(chat, "failed", frame.code);
          chat.el.querySelector(".answer").title = frame.message;
          notice(`${frame.code}: ${frame.message}`);
        }
        break;
      default:
        break;
    }
  }

  /** Add streamed text; keep the newest text in view unless the reader has scrolled up. */
  function appendText(chat, text) {
    const box = ui.chats;
    const following = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
    chat.answer.append(text);
    if (following) box.scrollTop = box.scrollHeight;
  }

  function onDone(chat, frame) {
    setState(chat, "done", frame.finish_reason === "length" ? "done (max tokens)" : "done");
    const t = frame.timings || {};
    const browser = chat.firstAt === null || chat.resumed ? null : chat.firstAt - chat.sentAt;
    if (browser !== null || t.ttft_ms !== undefined) {
      // Two figures: what this browser saw, and the server's own (received → first token sent).
      const parts = [];
      if (browser !== null) parts.push(`${ms(browser)} ms`);
      if (t.ttft_ms !== undefined) parts.push(`server ${ms(t.ttft_ms)} ms`);
      badge(chat, "ttft", "TTFT " + parts.join(" · "));
    }
    badge(chat, "cached", frame.cached ? "cached" : null);
    badge(chat, "model", frame.model ? `model ${frame.model}` : null);
    badge(
      chat,
      "route",
      frame.route ? `route ${frame.route}${frame.route_reason ? ` (${frame.route_reason})` : ""}` : null,
    );
    const usage = frame.usage;
    const cached = usage && usage.cached_prompt_tokens ? ` (${usage.cached_prompt_tokens} cached)` : "";
    badge(
      chat,
      "usage",
      usage ? `${usage.prompt_tokens}${cached} → ${usage.completion_tokens} tokens` : null,
    );
  }

  // --- asking and stopping -----------------------------------------------------------------
  function newChat(question) {
    counter += 1;
    const id = `c${counter}-${Math.random().toString(36).slice(2, 8)}`;
    const el = ui.template.content.firstElementChild.cloneNode(true);
    el.dataset.chatId = id;
    el.querySelector(".question").textContent = question;
    const chat = {
      id,
      el,
      answer: el.querySelector(".answer"),
      jobId: null,
      lastSeq: -1,
      sentAt: performance.now(),
      firstAt: null,
      running: true,
      resumed: false,
    };
    el.querySelector(".stop").addEventListener("click", () => stop(chat));
    chats.set(id, chat);
    ui.chats.append(el);
    el.scrollIntoView({ block: "end" });
    setState(chat, "waiting");
    return chat;
  }

  /** The question as typed so far, as a `draft` frame (the socket opened for it if need be:
   * the chat then finds it open too), not while an answer streams (the gateway would drop
   * it then). */
  async function sendDraft() {
    draftTimer = null;
    const text = ui.question.value.trim();
    if (!text || text === draftSent || !apiKey() || refused) return;
    if ([...chats.values()].some((c) => c.running)) return;
    try {
      await ensureSocket();
    } catch {
      return; // the chat, when sent, says what is wrong with the connection
    }
    if (ui.question.value.trim() !== text) return; // typed on meanwhile: its own timer sends
    draftSent = text;
    counter += 1;
    const frame = { type: "draft", id: `d${counter}`, messages: [], text };
    if (ui.model.value) frame.model = ui.model.value;
    send(frame);
  }

  function onTyping() {
    if (draftTimer !== null) clearTimeout(draftTimer);
    draftTimer = setTimeout(sendDraft, DRAFT_DEBOUNCE_MS);
  }

  async function ask(event) {
    event.preventDefault();
    if (draftTimer !== null) clearTimeout(draftTimer);
    draftTimer = null;
    draftSent = "";
    const question = ui.question.value.trim();
    if (!question) return;
    if (!apiKey()) {
      if (ui.key.value.trim()) useKey();
      else return notice("Enter an API key first.");
    }
    const frame = { type: "chat", messages: [{ role: "user", content: question }] };
    frame.model = ui.model.value;
    const maxTokens = parseInt(ui.maxTokens.value, 10);
    if (maxTokens > 0) frame.max_tokens = maxTokens;
    ui.question.value = "";
    const chat = newChat(question);
    frame.id = chat.id;
    try {
      await ensureSocket();
    } catch (err) {
      setState(chat, "failed", "no connection");
      notice(String(err.message || err));
      return;
    }
    chat.sentAt = performance.now();
    send(frame);
  }

  function stop(chat) {
    if (!chat.running) return;
    if (ws && ws.readyState === WebSocket.OPEN && chat.jobId) {
      send({ type: "cancel", id: chat.id });
      setState(chat, "streaming", "stopping…");
    } else {
      setState(chat, "stopped");
    }
  }

  // --- wiring ------------------------------------------------------------------------------
  ui.saveKey.addEventListener("click", useKey);
  ui.forgetKey.addEventListener("click", forgetKey);
  ui.key.addEventListener("keydown", (e) => {
    if (e.key === "Enter") useKey();
  });
  ui.form.addEventListener("submit", ask);
  ui.question.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) ask(e);
  });
  ui.question.addEventListener("input", onTyping);
  ui.key.value = apiKey();
  loadModels();

  // For tests and the console: drop the socket as a network failure would.
  window.firsttoken = {
    chats,
    dropConnection: () => ws && ws.close(4000, "dropped on purpose"),
  };
})();
