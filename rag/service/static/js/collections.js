// The collection picker: the collections the key may read (GET /v1/collections), the one shown
// chosen here; uploads go to it, questions draw on it, documents and conversations are its own.
// Does not: list documents or conversations (their modules do, in the collection shown).

import { currentCollection, getJson, setCollection } from "./api.js";
import { $, node } from "./dom.js";

/** Fill the picker with the collections the key may read (the one shown kept, and "default"). */
export async function refreshCollections() {
  const { collections } = await getJson("/v1/collections");
  const names = new Set(["default", currentCollection(), ...collections.map((c) => c.name)]);
  const counts = new Map(collections.map((c) => [c.name, c.documents]));
  const select = $("collection-select");
  select.replaceChildren(...[...names].sort().map((name) => {
    const option = node("option", "", counts.has(name) ? `${name} (${counts.get(name)})` : name);
    option.value = name;
    return option;
  }));
  select.value = currentCollection();
}

/** Show another collection when one is picked; `reload()` lists what is in it. */
export function setUpCollections(reload) {
  $("collection-select").addEventListener("change", (e) => {
    setCollection(e.target.value);
    reload();
  });
}
