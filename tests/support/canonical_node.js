#!/usr/bin/env node
// The JavaScript side of tests/test_canonical.py: what the Node reference of json-sort-v1 produces.
//
// Reads one request per line on stdin and writes one answer line per request on stdout, in order:
//
//   <JSON value>   ->  base64 of the UTF-8 bytes of JSON.stringify(sortKeysDeep(JSON.parse(line)))
//   H<JSON string> ->  lowercase hex SHA-256 of the string's UTF-8 bytes (the reference's hashString)
//   anything that throws -> "!" followed by the error message
//
// sortKeysDeep does what the reference does: it rebuilds every object by assigning its keys in
// Array.prototype.sort() order to a fresh {} (so the engine's own key order, array indices first,
// and the "__proto__" setter apply, as they do there) and maps undefined to null.
"use strict";

const crypto = require("node:crypto");
const readline = require("node:readline");

function sortKeysDeep(value) {
  if (value === undefined) return null;
  if (value === null || typeof value !== "object") {
    if (typeof value === "number" && !Number.isFinite(value)) throw new TypeError("non-finite number");
    return value;
  }
  if (Array.isArray(value)) return value.map(sortKeysDeep);
  const sorted = {};
  for (const key of Object.keys(value).sort()) sorted[key] = sortKeysDeep(value[key]);
  return sorted;
}

function answer(line) {
  try {
    if (line.startsWith("H")) {
      const text = JSON.parse(line.slice(1));
      return crypto.createHash("sha256").update(String(text), "utf8").digest("hex");
    }
    return Buffer.from(JSON.stringify(sortKeysDeep(JSON.parse(line))), "utf8").toString("base64");
  } catch (err) {
    return "!" + String(err && err.message).replace(/[\r\n]+/g, " ");
  }
}

const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity, terminal: false });
rl.on("line", (line) => {
  process.stdout.write(answer(line) + "\n");
});
rl.on("close", () => process.exit(0));
