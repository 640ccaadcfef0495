# Chorus: runs as a Hugging Face Space (sdk: docker, app_port: 7860) or anywhere Docker runs.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    TTS_HOST=0.0.0.0 \
    TTS_PORT=7860

# ffmpeg: Gradio converts the clone panel's uploads and recordings that are not WAV with it.
RUN apt-get update && apt-get install -y --no-install-recommends ffmpeg && rm -rf /var/lib/apt/lists/*

# Spaces run the container as user 1000; so do we everywhere.
RUN useradd --create-home --uid 1000 user
WORKDIR /home/user/app

COPY --chown=user requirements.txt .
# torch from PyTorch's CPU index first (PyPI's default build brings several GB of CUDA); for a GPU
# image, drop the index URL so the CUDA build is installed.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 && pip install -r requirements.txt

COPY --chown=user . .
USER user
ENV TTS_DATA_DIR=/home/user/app/data
RUN mkdir -p "$TTS_DATA_DIR/voices"

EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7860/health')"
CMD ["python", "app.py"]
