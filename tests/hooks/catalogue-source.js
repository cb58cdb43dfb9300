/**
 * The test build's catalogue source (replaces catalogue/source.js in
 * dist-test/): a test may point the catalogue at a local model host and
 * simulate a device, through `localStorage["napllm.testCatalogue"]`, JSON
 * `{url?: catalogue URL, device?: fit.js's device facts}`. Without it the
 * product's source answers.
 */

import * as product from "./source.product.js";

export const CATALOGUE_URL = product.CATALOGUE_URL;

function override() {
  try {
    return JSON.parse(localStorage.getItem("napllm.testCatalogue") || "null") || {};
  } catch {
    return {};
  }
}

export async function catalogueText() {
  const { url } = override();
  if (!url) return product.catalogueText();
  const response = await fetch(url);
  if (!response.ok) throw new Error("the test catalogue could not be read");
  return response.text();
}

export async function deviceFacts() {
  const { device } = override();
  return device || product.deviceFacts();
}
