// The API reference at /docs: the server's OpenAPI document as plain tables. Served from this origin
// with nothing loaded from elsewhere (the dashboard keeps API keys on it: no third-party script may run
// here), and built with textContent only, so a description can never become markup.
"use strict";

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

const refName = (ref) => ref.split("/").pop();

// One line for a JSON schema: a link to a named schema, else its type, enum or alternatives.
function typeOf(schema) {
  if (!schema) return "";
  if (schema.$ref) return el("a", { href: `#schema-${refName(schema.$ref)}` }, refName(schema.$ref));
  const alternatives = schema.anyOf || schema.oneOf;
  if (alternatives) {
    const span = el("span");
    alternatives.forEach((s, i) => span.append(...(i ? [" | "] : []), typeOf(s)));
    return span;
  }
  if (schema.enum) return schema.enum.map((v) => JSON.stringify(v)).join(" | ");
  if (schema.const !== undefined) return JSON.stringify(schema.const);
  if (schema.type === "array") {
    const span = el("span", {}, "array of ");
    span.append(typeOf(schema.items));
    return span;
  }
  return schema.type || (schema.additionalProperties ? "object" : "any");
}

function table(head, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, ...head.map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows.map((cells) => el("tr", {}, ...cells.map((c) => el("td", {}, c))))));
}

function operation(path, method, op) {
  const id = `op-${method}-${path}`;
  const card = el("section", { class: "card", id },
    el("h2", {}, el("code", {}, `${method.toUpperCase()} ${path}`), " ", el("span", { class: "muted" }, op.summary || "")));
  if (op.description) card.append(el("p", {}, op.description));
  const params = op.parameters || [];
  if (params.length) {
    card.append(table(["parameter", "in", "type", "required", "description"],
      params.map((p) => [p.name, p.in, typeOf(p.schema), p.required ? "yes" : "", p.description || ""])));
  }
  const body = op.requestBody && Object.entries(op.requestBody.content || {})[0];
  if (body) card.append(el("p", {}, `request body (${body[0]}): `, typeOf(body[1].schema)));
  card.append(table(["status", "meaning", "body"], Object.entries(op.responses || {}).map(([status, r]) => {
    const content = Object.entries(r.content || {})[0];
    return [status, r.description || "", content ? typeOf(content[1].schema) : ""];
  })));
  return card;
}

function schema(name, s) {
  const required = new Set(s.required || []);
  const card = el("section", { class: "card", id: `schema-${name}` }, el("h2", {}, el("code", {}, name)));
  if (s.description) card.append(el("p", {}, s.description));
  if (s.enum) card.append(el("p", {}, typeOf(s)));
  if (s.properties) {
    card.append(table(["field", "type", "required", "default", "description"],
      Object.entries(s.properties).map(([field, p]) => [field, typeOf(p), required.has(field) ? "yes" : "",
        p.default === undefined ? "" : JSON.stringify(p.default), p.description || ""])));
  }
  return card;
}

async function render() {
  const doc = await (await fetch("/openapi.json")).json();
  document.title = `${doc.info.title} API`;
  $("#title").textContent = `${doc.info.title} ${doc.info.version}`;
  $("#description").textContent = doc.info.description || "";
  const toc = el("ul");
  for (const [path, methods] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(methods)) {
      toc.append(el("li", {}, el("a", { href: `#op-${method}-${path}` }, `${method.toUpperCase()} ${path}`)));
      $("#operations").append(operation(path, method, op));
    }
  }
  $("#toc").append(toc);
  for (const [name, s] of Object.entries((doc.components || {}).schemas || {})) $("#schemas").append(schema(name, s));
}

render().catch((e) => { $("#docs-error").textContent = `could not read /openapi.json: ${e.message}`; });
