"""What the synthesis tab runs in the browser: the speech player, the character counter, the voice list's
and the history's buttons. The CSS uses Gradio's theme variables only, so it reads in light and dark mode.

The player is the same whether or not ffmpeg is installed: it fetches each piece (a WAV file) as the
synthesis makes it, queues it in Web Audio right after the one before, and draws the waveform of what
has arrived; it marks the caption word being spoken as it plays.
"""

PLAYER_HTML = """<div class="chorus-player">
<button class="chorus-play" type="button" aria-label="Play" disabled></button>
<canvas class="chorus-wave" height="56" title="Click to play from there"></canvas>
<span class="chorus-clock">0:00</span>
<span class="chorus-files"></span>
</div>"""

PLAYER_CSS = """
.chorus-player { display: flex; align-items: center; gap: var(--spacing-lg); padding: var(--block-padding);
  border: 1px solid var(--border-color-primary); border-radius: var(--block-radius);
  background: var(--block-background-fill); }
.chorus-play { width: 2.5rem; height: 2.5rem; flex: none; border-radius: 50%; border: none; cursor: pointer;
  display: grid; place-items: center; padding: 0;
  background: var(--button-primary-background-fill); color: var(--button-primary-text-color); }
/* The icons are drawn, not glyphs (a font's '❚❚' sat off-centre and was cut by the round button): a
   triangle, nudged right by a third of its width to sit at the circle's optical centre; two bars. */
.chorus-play::before { content: ""; width: 0; height: 0; margin-left: 0.25rem; border-style: solid;
  border-width: 0.55rem 0 0.55rem 0.8rem; border-color: transparent transparent transparent currentColor; }
.chorus-play.playing::before { width: 0.75rem; height: 0.9rem; margin: 0; border: none;
  background: linear-gradient(to right, currentColor 0 35%, transparent 35% 65%, currentColor 65% 100%); }
.chorus-play:disabled { opacity: 0.4; cursor: default; }
.chorus-wave { flex: 1; min-width: 0; height: 56px; cursor: pointer; color: var(--color-accent); }
.chorus-clock { flex: none; font-variant-numeric: tabular-nums; color: var(--body-text-color-subdued);
  font-size: var(--text-sm); }
.chorus-files { flex: none; display: flex; gap: var(--spacing-md); font-size: var(--text-md); }
.chorus-download { color: var(--link-text-color); }
@media (max-width: 480px) { .chorus-player { flex-wrap: wrap; } .chorus-wave { flex-basis: 100%; order: 3; } }
"""

# Pieces are queued back to back on one AudioContext clock: the take's time is `context.currentTime -
# origin`. A piece that arrives after the ones before have played (an underrun) starts where it
# belongs by moving the origin. window.chorusPlayer is there for the browser tests.
PLAYER_JS = """
const canvas = element.querySelector('canvas'), button = element.querySelector('.chorus-play');
const clock = element.querySelector('.chorus-clock'), files = element.querySelector('.chorus-files');
let context = null, take = null, buffers = [], peaks = [], loudest = 0.01, total = 0, done = false;
let playing = false, origin = 0, offset = 0, sources = [], frame = 0, fetched = 0, loading = Promise.resolve();
const audio = () => (context ||= new AudioContext());
const now = () => playing ? Math.min(audio().currentTime - origin, total) : offset;
const clockText = (s) => Math.floor(s / 60) + ':' + String(Math.floor(s % 60)).padStart(2, '0');

function schedule(buffer, start) {  // start: seconds from the take's beginning
  const at = origin + start, late = context.currentTime - at;
  if (late >= buffer.duration) return;
  const source = context.createBufferSource();
  source.buffer = buffer;
  source.connect(context.destination);
  if (late > 0) source.start(context.currentTime, late); else source.start(at);
  sources.push(source);
}
function stop() {
  for (const source of sources) source.stop();
  sources = [];
}
function play(from) {
  stop();
  audio().resume();
  origin = context.currentTime - from;
  playing = true;
  let start = 0;
  for (const buffer of buffers) { schedule(buffer, start); start += buffer.duration; }
  tick();
}
function pause() {
  offset = now();
  playing = false;
  stop();
  tick();
}
function add(buffer) {
  const data = buffer.getChannelData(0), step = Math.max(1, Math.round(buffer.sampleRate / 100));
  for (let i = 0; i < data.length; i += step) {  // one peak per 10 ms
    let peak = 0;
    for (let j = i; j < Math.min(i + step, data.length); j++) peak = Math.max(peak, Math.abs(data[j]));
    peaks.push(peak);
    loudest = Math.max(loudest, peak);
  }
  const start = total;
  buffers.push(buffer);
  total += buffer.duration;
  if (playing) {
    if (context.currentTime - origin > start) origin = context.currentTime - start;  // it waited for this one
    schedule(buffer, start);
  }
}
function mark(time) {  // the caption word being spoken
  for (const span of document.querySelectorAll('#speech-words .chorus-word')) {
    span.classList.toggle('spoken', +span.dataset.start <= time && time < +span.dataset.end);
  }
}
function draw(time) {
  const width = canvas.clientWidth, height = canvas.clientHeight, ratio = window.devicePixelRatio || 1;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  const pen = canvas.getContext('2d'), bars = Math.max(1, Math.floor(width / 3));
  pen.scale(ratio, ratio);
  const played = getComputedStyle(canvas).color, ahead = getComputedStyle(clock).color;
  for (let bar = 0; bar < bars && total > 0; bar++) {
    const from = Math.floor(bar / bars * peaks.length);
    const to = Math.max(from + 1, Math.floor((bar + 1) / bars * peaks.length));
    let level = 0;
    for (let i = from; i < to && i < peaks.length; i++) level = Math.max(level, peaks[i]);
    const tall = Math.max(1, Math.sqrt(level / loudest) * (height - 4));
    pen.fillStyle = (bar + 0.5) / bars * total <= time ? played : ahead;
    pen.fillRect(bar * 3, (height - tall) / 2, 2, tall);
  }
  clock.textContent = clockText(time) + ' / ' + clockText(Math.round(total));
}
function tick() {
  cancelAnimationFrame(frame);
  if (playing && done && now() >= total) { playing = false; stop(); offset = 0; }
  const time = now();
  draw(time);
  mark(time);
  button.disabled = !buffers.length;
  button.classList.toggle('playing', playing);
  button.setAttribute('aria-label', playing ? 'Pause' : 'Play');
  if (playing) frame = requestAnimationFrame(tick);
}
function fetchPiece(url, forTake) {
  loading = loading.then(async () => {
    const data = await (await fetch(url)).arrayBuffer();
    const buffer = await audio().decodeAudioData(data);
    if (take !== forTake) return;
    add(buffer);
    if (buffers.length === 1 && !playing) play(0); else tick();
  }).catch((error) => console.error('chorus player:', error));
}
function update() {
  if (!props.value) return;
  const value = JSON.parse(props.value);
  if (value.take !== take || value.replay) {
    stop();
    take = value.take; buffers = []; peaks = []; loudest = 0.01; total = 0; offset = 0; fetched = 0;
    playing = false; done = false;
  }
  for (; fetched < value.pieces.length; fetched++) fetchPiece(value.pieces[fetched], take);
  const forTake = take;
  loading.then(() => { if (take === forTake && value.done) { done = true; tick(); } });
  files.replaceChildren(...(value.download ? [value, ...(value.subtitles || [])] : []).map((file, index) => {
    const link = document.createElement('a');  // the file's type as its text, its name as the saved one
    link.className = 'chorus-download';
    link.href = file.download;
    link.download = link.title = file.name;
    link.textContent = (index ? '' : 'Download ') + file.name.split('.').pop().toUpperCase();
    return link;
  }));
  tick();
}
button.addEventListener('click', () => playing ? pause() : play(offset >= total ? 0 : offset));
canvas.addEventListener('click', (event) => {
  const time = event.offsetX / canvas.clientWidth * total;
  if (playing) play(time); else { offset = time; tick(); }
});
// The click that starts a synthesis, or plays a take of the history, lets this page's audio start (browsers
// ask for a user gesture; a page just loaded has had none).
const STARTS = '#synthesize, #speech-history button[data-action="replay"]';
document.addEventListener('click', (event) => { if (event.target.closest?.(STARTS)) audio().resume(); }, true);
new ResizeObserver(() => tick()).observe(canvas);
window.chorusPlayer = {
  seek: (time) => { if (playing) pause(); offset = time; tick(); },
  state: () => ({take, pieces: buffers.length, total, playing, done, time: now(), peaks: peaks.length,
                 audio: context && context.state}),
};
watch('value', update);
update();
"""

# Gradio's own SourceSansPro-SemiBold.woff2 is a 5 kB subset holding a few glyphs ("A" and "B" among them): those
# were drawn from it, every other letter from the Regular face made bold by the browser, heavier; so "API keys"
# and "Batch cost model." began with a lighter letter. Its Bold file is whole: semibold text uses it. (Relative,
# as the theme's own faces are: it works under any path prefix.)
PAGE_CSS = """@font-face { font-family: "Source Sans Pro"; font-weight: 600; font-style: normal;
  src: url("static/fonts/SourceSansPro/SourceSansPro-Bold.woff2") format("woff2"); }
.chorus-refusal { color: var(--error-icon-color); margin-top: var(--spacing-sm); font-weight: var(--weight-semibold); }
#speech-text:has(.chorus-refusal) textarea { box-shadow: 0 0 3px 1px var(--error-icon-color), var(--shadow-inset);
  border-color: transparent; }"""

WORDS_CSS = (".chorus-words { white-space: pre-wrap; font-size: var(--text-lg); color: var(--body-text-color); } "
             ".chorus-word.spoken { background: var(--color-accent); color: var(--button-primary-text-color); "
             "border-radius: 2px; box-shadow: 0 0 0 2px var(--color-accent); }")  # the Synthesize button's colours

# Counts what the text box holds as Python does (code points), against the caller's limit.
COUNTER_JS = """
const count = () => {
  const box = document.querySelector('#speech-text textarea'), shown = element.querySelector('.chorus-count');
  if (!box || !shown) return;
  const length = [...box.value].length;
  shown.textContent = length.toLocaleString('en');
  shown.classList.toggle('chorus-full', length >= +shown.dataset.limit);
};
document.addEventListener('input', (event) => { if (event.target.closest?.('#speech-text')) count(); }, true);
watch('value', count);
count();
// A refused text's message is shown above the box, which a phone may have scrolled away: it comes into view.
const textBlock = document.querySelector('#speech-text');
let refusal = null;
if (textBlock) new MutationObserver(() => {
  const shown = textBlock.querySelector('div.validation-error');
  if (shown && shown !== refusal) shown.scrollIntoView({block: 'center'});
  refusal = shown;
}).observe(textBlock, {childList: true, subtree: true});
"""
# An empty text is answered here, at the box, in the words and look of the server's refusals there (Gradio's
# validator, which answers the others with a 422): it sends no request. Typing takes the message away.
EMPTY_TEXT_JS = """
const refuseEmpty = (event) => {
  const block = document.querySelector('#speech-text'), box = block?.querySelector('textarea');
  const message = element.querySelector('.chorus-count')?.dataset.empty;
  if (!event.target.closest?.('#synthesize') || !box || !message || box.value.trim()) return;
  event.preventDefault();
  event.stopImmediatePropagation();  // before Gradio's own handler (delegated below the document): no request
  let shown = block.querySelector('.chorus-refusal');
  if (!shown) {
    shown = document.createElement('div');
    shown.className = 'validation-error chorus-refusal';
    (block.querySelector('[data-testid="block-info"]') || block).append(shown);
  }
  shown.textContent = message;
  box.focus();
};
document.addEventListener('click', refuseEmpty, true);
document.addEventListener('input', (event) => {
  if (event.target.closest?.('#speech-text')) document.querySelector('#speech-text .chorus-refusal')?.remove();
}, true);
"""
COUNTER_CSS = """font-size: var(--text-sm); color: var(--body-text-color-subdued); text-align: right;
.chorus-full { color: var(--error-text-color, var(--color-accent)); font-weight: bold; }"""

VOICES_JS = """
element.addEventListener('click', (event) => {
  const preview = event.target.closest('.chorus-preview'), row = event.target.closest('.chorus-voice');
  if (preview) trigger('preview', {voice: preview.dataset.voice});
  else if (row) trigger('choose', {voice: row.dataset.voice});
});
"""
VOICES_CSS = """
.chorus-voices h4 { margin: var(--spacing-md) 0 var(--spacing-sm); color: var(--body-text-color);
  font-size: var(--text-md); }
.chorus-voices ul { list-style: none; margin: 0; padding: 0; }
.chorus-voice { display: flex; gap: var(--spacing-md); align-items: center; padding: var(--spacing-sm);
  border-radius: var(--radius-md); cursor: pointer; color: var(--body-text-color); }
.chorus-voice:hover { background: var(--background-fill-secondary); }
.chorus-voice.chosen { outline: 2px solid var(--color-accent); }
.chorus-voice small { display: block; font-size: var(--text-md); color: var(--body-text-color); }
.chorus-preview { flex: none; width: 2rem; height: 2rem; border-radius: 50%; cursor: pointer;
  border: 1px solid var(--border-color-primary); background: var(--background-fill-primary);
  color: var(--color-accent); }
.chorus-badge { margin-left: var(--spacing-sm); padding: 0 var(--spacing-sm); border-radius: var(--radius-sm);
  font-size: var(--text-xs); background: var(--color-accent-soft); color: var(--body-text-color); }
"""

PREVIEW_JS = """
watch('value', () => {
  const audio = element.querySelector('audio');
  if (audio) { audio.currentTime = 0; audio.play().catch(() => {}); }  // a browser may refuse: its controls remain
});
"""

HISTORY_JS = """
const localTimes = () => {
  for (const time of element.querySelectorAll('time[data-at]')) {
    time.textContent = new Date(+time.dataset.at * 1000).toLocaleTimeString([], {hour: '2-digit', minute: '2-digit'});
  }
};
element.addEventListener('click', (event) => {
  const button = event.target.closest('button[data-action]');
  if (!button) return;
  const take = button.closest('li').dataset.take;
  if (button.dataset.action === 'replay') trigger('replay', {take}); else trigger('forget', {take});
});
watch('value', localTimes);
localTimes();
"""
HISTORY_CSS = """
.chorus-history { list-style: none; margin: 0; padding: 0; }
.chorus-history li { display: flex; flex-wrap: wrap; align-items: center; gap: var(--spacing-sm) var(--spacing-lg);
  padding: var(--spacing-md) 0; border-bottom: 1px solid var(--border-color-primary); color: var(--body-text-color); }
.chorus-history q { flex: 1 1 16rem; }
.chorus-history small { color: var(--body-text-color-subdued); }
.chorus-actions { display: flex; gap: var(--spacing-md); align-items: center; }
.chorus-actions button, .chorus-actions a { padding: var(--spacing-xs) var(--spacing-md); cursor: pointer;
  border: 1px solid var(--border-color-primary); border-radius: var(--radius-md); font-size: var(--text-sm);
  background: var(--background-fill-secondary); color: var(--body-text-color); text-decoration: none; }
.chorus-empty { color: var(--body-text-color-subdued); }
"""

# The Dialogue tab's recording and its files: each name whole, wrapped where a phone has no room for it.
RECORDING_CSS = "audio { width: 100%; }"
FILES_CSS = """
.chorus-files-title { margin: 0 0 var(--spacing-sm); font-weight: var(--weight-semibold);
  color: var(--body-text-color); }
.chorus-file-list { list-style: none; margin: 0; padding: 0; }
.chorus-file-list li { display: flex; flex-wrap: wrap; align-items: baseline; gap: 0 var(--spacing-md); margin: 0;
  padding: var(--spacing-xs) 0; color: var(--body-text-color-subdued); }
.chorus-file-list a { min-width: 0; margin: 0; padding: 0; color: var(--link-text-color); overflow-wrap: anywhere;
  font-size: var(--text-md); }
"""
