// The page `kiln serve` answers at /: a prompt, a few settings, the steps as they run and the
// image. It uses only the public API (POST /v1/jobs, the job's events and image). Its script is
// served apart (/kiln.js), so the page's Content-Security-Policy can forbid inline scripts.
#pragma once

namespace kiln::cli {

inline constexpr const char* kServePage = R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>kiln</title>
<style>
body { font-family: sans-serif; max-width: 48em; margin: 2em auto; padding: 0 1em; }
textarea { width: 100%; height: 4em; }
label { margin-right: 1em; }
input[type=number] { width: 6em; }
progress { width: 100%; }
#image { max-width: 100%; margin-top: 1em; display: block; }
#error { color: #b00020; white-space: pre-wrap; }
</style>
</head>
<body>
<h1>kiln</h1>
<form id="form">
<textarea id="prompt" required>A painting of a squirrel eating a burger</textarea>
<p>
<label>width <input id="width" type="number" min="16" step="16" placeholder="default"></label>
<label>height <input id="height" type="number" min="16" step="16" placeholder="default"></label>
<label>steps <input id="steps" type="number" min="1" placeholder="default"></label>
<label>seed <input id="seed" type="number" min="0" value="0"></label>
<button id="go" type="submit">Generate</button>
<button id="cancel" type="button" disabled>Cancel</button>
</p>
</form>
<progress id="progress" value="0" max="1"></progress>
<div id="status">idle</div>
<div id="error"></div>
<img id="image" alt="">
<script src="/kiln.js"></script>
</body>
</html>
)html";

inline constexpr const char* kServePageScript = R"js(const $ = (id) => document.getElementById(id);
let job = null;
$("form").addEventListener("submit", async (event) => {
  event.preventDefault();
  $("error").textContent = "";
  const body = { prompt: $("prompt").value, seed: Number($("seed").value || 0) };
  if ($("width").value && $("height").value) body.size = $("width").value + "x" + $("height").value;
  if ($("steps").value) body.steps = Number($("steps").value);
  $("go").disabled = true;
  const answer = await fetch("/v1/jobs", { method: "POST", headers: { "Content-Type": "application/json" },
                                           body: JSON.stringify(body) });
  const status = await answer.json();
  if (!answer.ok) {
    $("error").textContent = status.error ? status.error.message : answer.statusText;
    $("go").disabled = false;
    return;
  }
  job = status.id;
  $("cancel").disabled = false;
  $("status").textContent = "queued";
  const events = new EventSource("/v1/jobs/" + job + "/events");
  events.addEventListener("step", (e) => {
    const d = JSON.parse(e.data);
    $("progress").max = d.steps;
    $("progress").value = d.step;
    $("status").textContent = "step " + d.step + "/" + d.steps + " (" + d.seconds.toFixed(2) + " s)";
  });
  const end = (text) => { events.close(); $("go").disabled = false; $("cancel").disabled = true;
                          $("status").textContent = text; };
  events.addEventListener("done", () => { $("image").src = "/v1/jobs/" + job + "/image"; end("done"); });
  events.addEventListener("failed", (e) => { $("error").textContent = JSON.parse(e.data).error; end("failed"); });
  events.addEventListener("cancelled", () => end("cancelled"));
});
$("cancel").addEventListener("click", () => { if (job) fetch("/v1/jobs/" + job, { method: "DELETE" }); });
// The image's size once the browser has decoded it (what the page's test reads).
$("image").addEventListener("load", () => {
  $("image").dataset.loaded = $("image").naturalWidth + "x" + $("image").naturalHeight;
});
// A link can fill the form (/?prompt=...&width=...&height=...&steps=...&seed=...), never start it:
// a job starts only from the button, so no link or page elsewhere can spend the server's time.
const params = new URLSearchParams(location.search);
for (const field of ["prompt", "width", "height", "steps", "seed"])
  if (params.has(field)) $(field).value = params.get(field);
)js";

// Every answer's Content-Security-Policy: scripts only from the server itself (no inline ones),
// answers only to it, no plugins, forms or framing.
inline constexpr const char* kServePagePolicy =
    "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

}  // namespace kiln::cli
