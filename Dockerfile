# Chorus: runs as a Hugging Face Space (sdk: docker, app_port: 7860) or anywhere Docker runs.
#   CPU image (the default):  docker build -t chorus .
#   CUDA image:               docker build --build-arg TORCH_INDEX=https://pypi.org/simple -t chorus:cuda .
# Run it with its data on a volume:  docker run -p 7860:7860 -v chorus-data:/data chorus
# More (the admin token, Wyoming, several replicas): docs/deployment.md.
FROM python:3.11-slim

# Where torch comes from: PyTorch's CPU index by default (PyPI's build brings several GB of CUDA
# libraries that a CPU has no use for); PyPI itself for the CUDA build, run with `docker run --gpus all`.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

# TTS_DATA_DIR=/data: the database, keys, settings, voices, jobs and their results; /data is also the path a
# Hugging Face Space's persistent storage is mounted on. TTS_WYOMING_PORT: Home Assistant's Wyoming protocol,
# on 10200 as Wyoming's Piper. TTS_ADMIN_TOKEN is not set here: pass it (docker run -e TTS_ADMIN_TOKEN) to
# turn on the Admin tab and API.
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    TTS_HOST=0.0.0.0 \
    TTS_PORT=7860 \
    TTS_WYOMING_PORT=10200 \
    TTS_DATA_DIR=/data

# ffmpeg: Gradio converts the clone panel's uploads and recordings that are not WAV with it. (Debian's
# versions are not pinned: the base image's release decides them, and old ones leave its mirrors.)
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends ffmpeg && rm -rf /var/lib/apt/lists/*

# Spaces run the container as user 1000; so do we everywhere. It owns /data and /data/results, so that a
# named volume mounted on either (deploy/compose.yaml shares one results volume between replicas) starts
# out as its own: Docker gives a new volume the owner of the image's folder it is mounted on.
RUN useradd --create-home --uid 1000 user && mkdir -p /data/results && chown -R user:user /data
WORKDIR /home/user/app

COPY --chown=user requirements.txt requirements-kokoro.txt ./
RUN pip install --index-url "$TORCH_INDEX" torch==2.13.0 && pip install -r requirements.txt -r requirements-kokoro.txt

COPY --chown=user . .
USER 1000
# The bundled voice's int8 graph (degrade mode's lower precision), calibrated once here into ~/.cache/chorus rather
# than at every start.
RUN python -c "from tts_core.engines.piper import PiperEngine, bundled_voice_path; PiperEngine(bundled_voice_path())"
VOLUME /data

EXPOSE 7860 10200
# Healthy once /ready answers 200: the models loaded at start are warm and calibrated (a restart on the same /data
# reuses the calibration kept there: healthy in about the time to load them). 503 until then fails the check.
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ready' % os.environ['TTS_PORT'], timeout=4)"]
CMD ["python", "app.py"]
