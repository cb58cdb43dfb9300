/**
 * The worst case of a JSON Schema `pattern` for a grammar-constrained
 * sampler (docs/security.md, "grammar cost"): a model service following
 * the schema keeps every way the text so far can match alive at once and
 * checks each candidate token against each, so a pattern whose ways
 * multiply (`a?a?a?…` written out, overlapping alternatives) stalls every
 * other client of that service. Its text does not show it; its automaton
 * does.
 *
 * Rules
 * - `patternCost` builds the pattern's position automaton (each
 *   character-matching atom is a position; counted repetitions written out,
 *   the optional copies nested as a grammar writes them; anchors and
 *   lookarounds match no character) and walks it adversarially: at each
 *   step one character of every class the live positions tell apart is tried and the
 *   step doing the most work (positions reached through every live position
 *   that accepts it, with repeats) is followed; a visited set of positions
 *   is not followed again.
 * - `patternIsAffordable`: the most live positions stay within `MAX_LIVE`
 *   and the most work of one character within `MAX_WORK`.
 * - Bounded: `MAX_POSITIONS` positions, `MAX_EDGES` edges, `MAX_STEPS`
 *   steps, no recursion.
 * - The runtime holds the same rule in Python (napllm.pattern_cost); the
 *   two change together.
 */

export const MAX_LIVE = 64;
export const MAX_WORK = 400;
const MAX_POSITIONS = 4000;
const MAX_EDGES = 200000;
const MAX_STEPS = 256;
const MAX_CHAR = 0x10ffff;
const CLASS_ESCAPES = {
  d: [[48, 57]],
  w: [[48, 57], [65, 90], [95, 95], [97, 122]],
  s: [[9, 13], [32, 32], [160, 160], [0x2028, 0x2029], [0xfeff, 0xfeff]],
};
const CHAR_ESCAPES = { n: 10, r: 13, t: 9, f: 12, v: 11, 0: 0 };
const HEX = /^[0-9a-fA-F]+$/;

class TooCostly extends Error {}

function complement(ranges) {
  const out = [];
  let low = 0;
  for (const [start, end] of [...ranges].sort((a, b) => a[0] - b[0])) {
    if (start > low) out.push([low, start - 1]);
    low = Math.max(low, end + 1);
  }
  if (low <= MAX_CHAR) out.push([low, MAX_CHAR]);
  return out;
}

const frag = (first, last, nullable) => ({ first, last, nullable });
const EMPTY = () => frag([], [], true);

class Builder {
  constructor() {
    this.ranges = [];
    this.follow = [];
    this.edges = 0;
  }

  link(sources, targets) {
    this.edges += sources.length * targets.length;
    if (this.edges > MAX_EDGES) throw new TooCostly();
    for (const p of sources) for (const q of targets) this.follow[p].add(q);
  }

  atom(ranges) {
    if (this.ranges.length >= MAX_POSITIONS) throw new TooCostly();
    this.ranges.push(ranges);
    this.follow.push(new Set());
    const index = this.ranges.length - 1;
    return frag([index], [index], false);
  }

  concat(a, b) {
    this.link(a.last, b.first);
    return frag(a.nullable ? [...a.first, ...b.first] : a.first, b.nullable ? [...a.last, ...b.last] : b.last, a.nullable && b.nullable);
  }

  copy([start, end], f) {
    const shift = this.ranges.length - start;
    if (this.ranges.length + end - start > MAX_POSITIONS) throw new TooCostly();
    for (let p = start; p < end; p += 1) {
      this.ranges.push(this.ranges[p]);
      this.follow.push(new Set([...this.follow[p]].filter((q) => q >= start && q < end).map((q) => q + shift)));
      this.edges += this.follow[this.follow.length - 1].size;
    }
    if (this.edges > MAX_EDGES) throw new TooCostly();
    return frag(f.first.map((p) => p + shift), f.last.map((p) => p + shift), f.nullable);
  }

  repeat(span, f, low, high) {
    const copies = Math.max(low, high === null ? 1 : high);
    if (copies === 0) return EMPTY();
    const parts = [f];
    for (let k = 1; k < copies; k += 1) parts.push(this.copy(span, f));
    if (high === null) {
      const last = parts[parts.length - 1];
      this.link(last.last, last.first);
      if (low === 0) return frag(last.first, last.last, true);
    }
    let tail = EMPTY();
    for (let k = parts.length - 1; k >= low; k -= 1) {
      const joined = this.concat(parts[k], tail);
      tail = frag(joined.first, joined.last, true);
    }
    let out = EMPTY();
    for (let k = 0; k < low; k += 1) out = this.concat(out, parts[k]);
    return this.concat(out, tail);
  }
}

/** The ranges of the escape at source[i] (a backslash), null for an assertion, and the index after it. */
function escape(source, i) {
  if (i + 1 >= source.length) throw new TooCostly();
  const c = source[i + 1];
  const lower = c.toLowerCase();
  if (lower in CLASS_ESCAPES && (c === lower || c === lower.toUpperCase())) {
    const ranges = CLASS_ESCAPES[lower];
    return [c !== lower ? complement(ranges) : ranges, i + 2];
  }
  if (c === "b" || c === "B") return [null, i + 2];
  if (c in CHAR_ESCAPES) return [[[CHAR_ESCAPES[c], CHAR_ESCAPES[c]]], i + 2];
  if (c === "x" || c === "u") {
    let digits = "";
    let next = i + 2;
    if (c === "u" && source[i + 2] === "{") {
      const end = source.indexOf("}", i + 3);
      digits = end === -1 ? "" : source.slice(i + 3, end);
      next = end + 1;
    } else {
      const width = c === "x" ? 2 : 4;
      digits = source.slice(i + 2, i + 2 + width);
      next = i + 2 + width;
      if (digits.length !== width) digits = "";
    }
    if (digits && digits.length <= 6 && HEX.test(digits)) {
      const point = Math.min(parseInt(digits, 16), MAX_CHAR);
      return [[[point, point]], next];
    }
    return [[[c.codePointAt(0), c.codePointAt(0)]], i + 2];
  }
  if (c === "c" && i + 2 < source.length && /[A-Za-z]/.test(source[i + 2])) {
    const point = source.codePointAt(i + 2) % 32;
    return [[[point, point]], i + 3];
  }
  if (/[1-9k]/.test(c)) throw new TooCostly(); // backreference
  return [[[c.codePointAt(0), c.codePointAt(0)]], i + 2];
}

function charClass(source, i) {
  i += 1;
  const negated = source[i] === "^";
  if (negated) i += 1;
  let ranges = [];
  while (i < source.length && source[i] !== "]") {
    let item;
    if (source[i] === "\\") {
      const [got, next] = escape(source, i);
      item = got === null ? [[8, 8]] : got;
      i = next;
    } else {
      const point = source.codePointAt(i);
      item = [[point, point]];
      i += point > 0xffff ? 2 : 1;
    }
    if (item.length === 1 && item[0][0] === item[0][1] && source[i] === "-" && i + 1 < source.length && source[i + 1] !== "]") {
      let upper;
      if (source[i + 1] === "\\") {
        [upper, i] = escape(source, i + 1);
      } else {
        const point = source.codePointAt(i + 1);
        upper = [[point, point]];
        i += point > 0xffff ? 3 : 2;
      }
      if (upper === null || upper.length !== 1 || upper[0][0] !== upper[0][1]) {
        ranges = ranges.concat(item, [[45, 45]], upper || []);
      } else {
        ranges.push([Math.min(item[0][0], upper[0][0]), Math.max(item[0][0], upper[0][0])]);
      }
      continue;
    }
    ranges = ranges.concat(item);
  }
  if (i >= source.length) throw new TooCostly();
  return [negated ? complement(ranges) : ranges, i + 1];
}

function automaton(source) {
  const b = new Builder();
  // Per open group: alternatives, the sequence so far, its pending last atom
  // ({span, f} or null), the group's first position and whether it is a lookaround.
  const stack = [{ alts: [], seq: EMPTY(), last: null, start: 0, look: false }];
  const top = () => stack[stack.length - 1];
  const push = (f, span) => {
    const frame = top();
    if (frame.last !== null) frame.seq = b.concat(frame.seq, frame.last.f);
    frame.last = { span, f };
  };
  const close = (frame) => {
    frame.alts.push(frame.last === null ? frame.seq : b.concat(frame.seq, frame.last.f));
    frame.seq = EMPTY();
    frame.last = null;
  };
  const union = (alts) => frag(alts.flatMap((a) => a.first), alts.flatMap((a) => a.last), alts.some((a) => a.nullable));
  let i = 0;
  while (i < source.length) {
    const c = source[i];
    if (c === "(") {
      const frame = { alts: [], seq: EMPTY(), last: null, start: b.ranges.length, look: false };
      stack.push(frame);
      if (source[i + 1] === "?") {
        if (source[i + 2] === "<" && source[i + 3] !== "=" && source[i + 3] !== "!") {
          const end = source.indexOf(">", i);
          if (end === -1) throw new TooCostly();
          i = end + 1;
          continue;
        }
        frame.look = source[i + 2] === "=" || source[i + 2] === "!" || source[i + 2] === "<";
        i += source[i + 2] === "<" ? 4 : 3;
        continue;
      }
      i += 1;
      continue;
    }
    if (c === "|" || c === ")") {
      const frame = top();
      close(frame);
      i += 1;
      if (c === "|") continue;
      if (stack.length === 1) throw new TooCostly();
      stack.pop();
      push(frame.look ? EMPTY() : union(frame.alts), [frame.start, b.ranges.length]);
      continue;
    }
    if (c === "*" || c === "+" || c === "?" || c === "{") {
      let low = 0;
      let high = null;
      let next = i + 1;
      if (c === "+") low = 1;
      else if (c === "?") high = 1;
      else if (c === "{") {
        const m = /^\{(\d+)(,(\d*))?\}/.exec(source.slice(i, i + 24));
        if (m === null) {
          const start = b.ranges.length;
          push(b.atom([[123, 123]]), [start, start + 1]);
          i += 1;
          continue;
        }
        if (m[1].length > 6 || (m[3] || "").length > 6) throw new TooCostly();
        low = Number(m[1]);
        high = m[2] === undefined ? low : m[3] === "" ? null : Number(m[3]);
        next = i + m[0].length;
      }
      const frame = top();
      if (frame.last === null) throw new TooCostly();
      if (high !== null && high < low) throw new TooCostly();
      const { span, f } = frame.last;
      const repeated = b.repeat(span, f, low, high);
      frame.last = { span: [span[0], b.ranges.length], f: repeated };
      i = next + (source[next] === "?" ? 1 : 0);
      continue;
    }
    const start = b.ranges.length;
    if (c === "[") {
      const [ranges, next] = charClass(source, i);
      push(b.atom(ranges), [start, start + 1]);
      i = next;
    } else if (c === "\\") {
      const [ranges, next] = escape(source, i);
      push(ranges === null ? EMPTY() : b.atom(ranges), [start, ranges === null ? start : start + 1]);
      i = next;
    } else if (c === "^" || c === "$") {
      push(EMPTY(), [start, start]);
      i += 1;
    } else if (c === ".") {
      push(b.atom(complement([[10, 10], [13, 13], [0x2028, 0x2029]])), [start, start + 1]);
      i += 1;
    } else {
      const point = source.codePointAt(i);
      push(b.atom([[point, point]]), [start, start + 1]);
      i += point > 0xffff ? 2 : 1;
    }
  }
  if (stack.length !== 1) throw new TooCostly();
  close(stack[0]);
  return [b, union(stack[0].alts)];
}

/**
 * The worst case of a pattern for a grammar sampler (module rules).
 *
 * @param {string} source the pattern (ECMA-262 syntax).
 * @returns {{live: number, work: number}} the most live positions and the most work of one character.
 * @throws {Error} for a pattern it cannot read (a backreference too) or one over MAX_POSITIONS positions.
 */
export function patternCost(source) {
  const [b, whole] = automaton(source);
  const key = (set) => [...set].sort((x, y) => x - y).join(",");
  let current = [...new Set(whole.first)];
  let live = current.length;
  let work = 0;
  const visited = new Set([key(current)]);
  for (let step = 0; step < MAX_STEPS; step += 1) {
    if (live > MAX_LIVE) break;
    // One character per class that the live positions tell apart.
    const cuts = new Set([0]);
    for (const position of current) {
      for (const [low, high] of b.ranges[position]) {
        cuts.add(low);
        if (high < MAX_CHAR) cuts.add(high + 1);
      }
    }
    const byMatching = new Map();
    for (const point of [...cuts].sort((x, y) => x - y)) {
      const matching = current.filter((p) => b.ranges[p].some(([lo, hi]) => lo <= point && point <= hi));
      if (matching.length) byMatching.set(key(matching), matching);
    }
    let best = null;
    for (const matching of byMatching.values()) {
      let stepWork = 0;
      const next = new Set();
      for (const p of matching) {
        stepWork += b.follow[p].size;
        for (const q of b.follow[p]) next.add(q);
      }
      work = Math.max(work, stepWork);
      live = Math.max(live, next.size);
      const k = key(next);
      if (!visited.has(k) && (best === null || stepWork > best.work || (stepWork === best.work && next.size > best.next.size))) {
        best = { work: stepWork, next, k };
      }
    }
    if (best === null || work > MAX_WORK || live > MAX_LIVE) break;
    current = [...best.next];
    visited.add(best.k);
  }
  return { live, work };
}

/**
 * Whether a pattern stays within MAX_LIVE and MAX_WORK (module rules);
 * false for one that cannot be read or is too large.
 *
 * @param {string} source
 * @returns {boolean}
 */
export function patternIsAffordable(source) {
  try {
    const { live, work } = patternCost(source);
    return live <= MAX_LIVE && work <= MAX_WORK;
  } catch {
    return false;
  }
}
