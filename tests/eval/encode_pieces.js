// Encodes each string of a JSON list with gpt-3-encoder (the reference implementation of GPT-2's
// tokenizer) and prints a JSON list of their ids. Usage: node encode_pieces.js NODE_MODULES_DIR FILE
const path = require('path');
const fs = require('fs');
const { encode } = require(path.resolve(process.argv[2], 'gpt-3-encoder'));
const pieces = JSON.parse(fs.readFileSync(process.argv[3], 'utf-8'));
fs.writeFileSync(1, JSON.stringify(pieces.map((p) => (p.length ? encode(p) : []))) + '\n');
