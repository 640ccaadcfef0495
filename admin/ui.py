"""The Admin tab, behind a token: one module per panel (admin/panels/: the dashboard, the settings form, API
keys, cloned voices, the pronunciation lexicon and the audit log), each in a tab of its own (cloned voices
and the lexicon share one), composed here with what spans them:
signing in fills the panels, and a timer refreshes the dashboard and the audit log every second."""

from __future__ import annotations

import gradio as gr

from access.control import AccessControl
from clones import VoiceClones
from tts_core.controls import ServiceControls
from tts_core.monitor import Monitor
from tts_core.request.access import client_address

from .cluster import ReplicaReporter
from .control import OperatorControl
from .gate import AdminGate, AdminRefused
from .lexicon import LexiconControl
from .panels.audit import NO_CHANGES, AuditLog
from .panels.clones import ClonesPanel
from .panels.dashboard import Dashboard
from .panels.keys import KeysPanel
from .panels.lexicon import LexiconPanel
from .panels.settings import SettingsPanel
from .panels.tables import LOCAL_TIMES_JS, hinted


def _address(request: gr.Request | None, access: AccessControl) -> str:
    peer = request.client.host if request is not None and request.client else None
    forwarded = request.headers.get("x-forwarded-for") if request is not None else None
    return client_address(peer, forwarded, access.trusted_proxies)


class AdminTab:
    def __init__(self, controls: ServiceControls, monitor: Monitor, control: OperatorControl, access: AccessControl,
                 gate: AdminGate, clones: VoiceClones, lexicon: LexiconControl, replicas: ReplicaReporter | None):
        self.access, self.gate = access, gate
        self.dashboard = Dashboard(controls, monitor, control, access, replicas)
        self.settings = SettingsPanel(control)
        self.keys = KeysPanel(access, lambda: list(control.settings.tiers))  # the tiers in force when asked
        self.clones = ClonesPanel(clones)
        self.lexicon = LexiconPanel(lexicon)
        self.audit = AuditLog(control)

    def render(self) -> None:
        signed_in = gr.State(False)
        with gr.Column(visible=True) as login_box:
            token = gr.Textbox(label="Admin token", type="password")
            login = gr.Button("Sign in", variant="primary")
            login_message = gr.Markdown()
        with gr.Column(visible=False) as panel:
            gr.HTML(js_on_load=LOCAL_TIMES_JS)
            self._sections(signed_in)
        audit_shown = gr.State(None)  # the rows the table shows: it is sent again only when they change
        timer = gr.Timer(1.0)
        signing_in = login.click(self.sign_in, [token], [signed_in, login_box, panel, login_message, *self.keys.outputs,
                                                         *self.settings.inputs.values()],
                                 api_visibility="private")
        signing_in.then(self.clones.list_clones, [signed_in], self.clones.outputs, api_visibility="private"
                        ).then(self.lexicon.list_lexicon, [signed_in], self.lexicon.outputs, api_visibility="private")
        timer.tick(self.refresh, [signed_in, audit_shown],
                   [*self.dashboard.outputs, self.audit.table, audit_shown, self.audit.hint],
                   api_visibility="private", show_progress="hidden")

    def _sections(self, signed_in: gr.State) -> None:
        """A tab per concern: on one page the tab was 4,252 px tall, its settings alone a screen and a half."""
        with gr.Tabs(elem_id="admin-sections", overflow_behavior="wrap"):  # on a phone: two rows, none hidden
            with gr.Tab("Dashboard"):
                self.dashboard.render()
            with gr.Tab("Settings"):
                self.settings.render(signed_in)
            with gr.Tab("API keys"):
                self.keys.render(signed_in)
            with gr.Tab("Voices and lexicon"):
                self.clones.render(signed_in)
                self.lexicon.render(signed_in)
            with gr.Tab("Audit log"):
                self.audit.render()

    def sign_in(self, given: str, request: gr.Request):
        try:
            self.gate.check(given, _address(request, self.access))
        except AdminRefused as refused:
            return [False, gr.update(), gr.update(), f"{refused.message}.",
                    *[gr.update()] * (len(self.keys.outputs) + len(self.settings.inputs))]
        return [True, gr.update(visible=False), gr.update(visible=True), "", *self.keys.listing(),
                *self.settings.form_values()]

    def refresh(self, is_signed_in: bool, shown: list | None):
        """The dashboard, and the audit log (whatever changed it: this tab, the admin API, another replica)."""
        if not is_signed_in:
            return [gr.skip()] * (len(self.dashboard.outputs) + 3)
        updates = self.dashboard.updates()
        rows = self.audit.rows()
        if rows is None or rows == shown:
            return [*updates, gr.skip(), gr.skip(), gr.skip()]
        return [*updates, rows, rows, hinted(rows, NO_CHANGES)]


def build_admin_tab(controls: ServiceControls, monitor: Monitor, control: OperatorControl, access: AccessControl,
                    gate: AdminGate, clones: VoiceClones, lexicon: LexiconControl,
                    replicas: ReplicaReporter | None = None) -> None:
    """Render the tab inside the current gr.Blocks. Its handlers are plain functions (Gradio runs them in
    worker threads) or, for cloned voices, coroutines whose storage calls run in worker threads: the
    database is never waited on from the event loop."""
    with gr.Tab("Admin"):
        if not gate.enabled:
            gr.Markdown("### Admin is disabled\nSet `TTS_ADMIN_TOKEN` and restart to enable the dashboard.")
            return
        AdminTab(controls, monitor, control, access, gate, clones, lexicon, replicas).render()
