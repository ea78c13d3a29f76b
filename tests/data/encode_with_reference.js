// Encodes the concatenation of the files named on the command line with gpt-3-encoder, the
// reference implementation of GPT-2's tokenizer, and prints one id per line.
// Usage: node encode_with_reference.js NODE_MODULES_DIR FILE...
//
// encode() appends with Array.concat, which is quadratic in the number of ids, so the text is
// encoded in chunks. Chunks are cut between matches of the reference's own pattern (applied to
// the whole text), and only after a match that ends in a non-space character: a match there
// never depended on what follows (only the whitespace alternative looks ahead), and matching
// has no look-behind, so each chunk re-finds exactly its matches of the whole text and the ids
// are those of encode(whole text).
const path = require('path');
const fs = require('fs');
const { encode } = require(path.resolve(process.argv[2], 'gpt-3-encoder'));
const pat = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;
const reference = fs.readFileSync(path.join(process.argv[2], 'gpt-3-encoder', 'Encoder.js'), 'utf-8');
if (!reference.includes(`const pat = /${pat.source}/gu`)) throw new Error('gpt-3-encoder changed its pattern');
const text = process.argv.slice(3).map(f => fs.readFileSync(f, 'utf-8')).join('');
const pieces = Array.from(text.matchAll(pat), m => m[0]);
const lines = [];
let start = 0;
for (let i = 0; i < pieces.length; i++) {
  const last = pieces[i][pieces[i].length - 1];
  if ((i - start >= 256 && !/\s/u.test(last)) || i === pieces.length - 1) {
    for (const id of encode(pieces.slice(start, i + 1).join(''))) lines.push(id);
    start = i + 1;
  }
}
fs.writeFileSync(1, lines.join('\n') + '\n');
