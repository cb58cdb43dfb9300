/**
 * The bound on regular expressions a napplet's JSON Schema may hold
 * (`pattern`, `patternProperties`): the validator runs them on the model's
 * answer and on tool arguments, in the napplet's own thread.
 *
 * Rules
 * - A pattern runs only if `regexIsBounded` accepts it: no quantified group
 *   that itself repeats a quantifier or holds an alternation, no
 *   backreference, at most `MAX_PATTERN_CHARS` characters. The check is
 *   syntactic and linear in the pattern's length; it refuses some safe
 *   patterns rather than admit an exponential one.
 * - The LMSP service holds the same rule in Python
 *   (napllm.lmsp_service.grammar); the two change together. What this
 *   syntactic rule cannot see (the same ambiguity written out, `a?a?a?…`)
 *   is pattern-cost.js's `patternIsAffordable`, which schema.js applies too.
 */

import { MAX_PATTERN_CHARS } from "./limits.js";

/**
 * Whether a regular expression source is free of the shapes that make a
 * backtracking engine take exponential time: a quantified group that itself
 * holds a quantifier or an alternation (`(a+)+`, `(a|a)*`; an optional
 * group such as `(a+)?` is fine), and backreferences. A conservative syntactic check (it refuses some safe
 * patterns, such as `(ab|cd)*`; `[abcd]*` or a pattern without the group
 * quantifier can replace them).
 *
 * @param {string} source the pattern (JSON Schema `pattern`, ECMA-262 syntax).
 * @returns {boolean}
 */
export function regexIsBounded(source) {
  if (typeof source !== "string" || source.length > MAX_PATTERN_CHARS) return false;
  // One frame per open group: whether it holds a quantifier or an alternation.
  const stack = [{ risky: false }];
  let lastGroupRisky = false; // the atom just closed was a risky group
  let afterAtom = false;
  for (let i = 0; i < source.length; i += 1) {
    const c = source[i];
    if (c === "\\") {
      const next = source[i + 1];
      if (next === undefined) return false;
      if (/[1-9]/.test(next) || next === "k") return false; // backreference
      i += 1;
      afterAtom = true;
      lastGroupRisky = false;
      continue;
    }
    if (c === "[") {
      // a class: skip to its end (escapes inside included)
      i += 1;
      if (source[i] === "^") i += 1;
      if (source[i] === "]") i += 1;
      while (i < source.length && source[i] !== "]") {
        if (source[i] === "\\") i += 1;
        i += 1;
      }
      if (i >= source.length) return false;
      afterAtom = true;
      lastGroupRisky = false;
      continue;
    }
    if (c === "(") {
      stack.push({ risky: false });
      if (source[i + 1] === "?") {
        // (?: (?= (?! (?<= (?<! (?<name>
        i += 1;
        if (source[i + 1] === "<" && source[i + 2] !== "=" && source[i + 2] !== "!") {
          const end = source.indexOf(">", i);
          if (end === -1) return false;
          i = end;
        } else {
          i += source[i + 1] === "<" ? 2 : 1;
        }
      }
      afterAtom = false;
      continue;
    }
    if (c === ")") {
      if (stack.length === 1) return false;
      const group = stack.pop();
      lastGroupRisky = group.risky;
      if (group.risky) stack[stack.length - 1].risky = true;
      afterAtom = true;
      continue;
    }
    if (c === "|") {
      stack[stack.length - 1].risky = true;
      afterAtom = false;
      lastGroupRisky = false;
      continue;
    }
    const quantifier = c === "*" || c === "+" || c === "?" || (c === "{" && /^\{\d+(,\d*)?\}/.test(source.slice(i, i + 24)));
    if (quantifier && afterAtom) {
      // `?`, `{0,1}` and `{1}` do not repeat: only repeating quantifiers nest badly.
      const bounds = c === "{" ? /^\{(\d+)(,(\d*))?\}/.exec(source.slice(i, i + 24)) : null;
      const repeats = c === "*" || c === "+" || (bounds !== null && (bounds[2] === undefined ? Number(bounds[1]) > 1 : bounds[3] === "" || Number(bounds[3]) > 1));
      if (lastGroupRisky && repeats) return false;
      stack[stack.length - 1].risky = true;
      if (c === "{") i = source.indexOf("}", i);
      if (source[i + 1] === "?") i += 1; // lazy
      afterAtom = false;
      lastGroupRisky = false;
      continue;
    }
    afterAtom = true;
    lastGroupRisky = false;
  }
  return stack.length === 1;
}
