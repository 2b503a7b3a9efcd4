// Command flotilla-image writes a container image with no base layer, from
// files on this machine, as an OCI layout and a docker-archive tarball, with
// no engine. Every timestamp, owner and order is fixed, so two builds of the
// same files give the same digest.
//
//	flotilla-image -name ghcr.io/example/flotilla:0.1.0 -layout DIR -tar FILE \
//	    -entrypoint /usr/local/bin/flotilla -user 65532:65532 -expose 50051,8080 \
//	    /usr/local/bin/flotilla=target/.../flotilla
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	ref := flag.String("name", "", "image reference written into the layout and the tarball")
	layoutDir := flag.String("layout", "", "OCI layout directory to (re)write")
	tarPath := flag.String("tar", "", "docker-archive tarball to write (what ctr images import reads)")
	entrypoint := flag.String("entrypoint", "", "the command the image runs")
	user := flag.String("user", "", "uid:gid the image runs as")
	expose := flag.String("expose", "", "ports the image serves, comma-separated (documentation, as EXPOSE)")
	flag.Parse()
	if *ref == "" || *layoutDir == "" || *tarPath == "" || *entrypoint == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: flotilla-image -name REF -layout DIR -tar FILE -entrypoint PATH [-user UID:GID] IMAGEPATH=HOSTPATH...")
		os.Exit(2)
	}
	if err := build(*ref, *layoutDir, *tarPath, *entrypoint, *user, *expose, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "flotilla-image:", err)
		os.Exit(1)
	}
}

func build(ref, layoutDir, tarPath, entrypoint, user, expose string, files []string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	layerTar, err := layerOf(files)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Config.Entrypoint = []string{entrypoint}
	cfg.Config.User = user
	cfg.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	if expose != "" {
		cfg.Config.ExposedPorts = map[string]struct{}{}
		for _, p := range strings.Split(expose, ",") {
			cfg.Config.ExposedPorts[p+"/tcp"] = struct{}{}
		}
	}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return err
	}
	if err := os.RemoveAll(layoutDir); err != nil {
		return err
	}
	p, err := layout.Write(layoutDir, empty.Index)
	if err != nil {
		return err
	}
	annotations := map[string]string{"org.opencontainers.image.ref.name": tag.String()}
	if err := p.AppendImage(img, layout.WithAnnotations(annotations)); err != nil {
		return err
	}
	if err := tarball.WriteToFile(tarPath, tag, img); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Println(digest.String())
	return nil
}

// layerOf writes one uncompressed tar: parent directories first, then the
// files, sorted, owned by root, dated 1970, with their permission bits.
func layerOf(specs []string) ([]byte, error) {
	sources := map[string]string{}
	for _, s := range specs {
		inImage, onHost, ok := strings.Cut(s, "=")
		if !ok || !path.IsAbs(inImage) {
			return nil, fmt.Errorf("%q: want /path/in/image=path/on/host", s)
		}
		sources[path.Clean(inImage)[1:]] = onHost
	}
	dirs := map[string]bool{}
	var names []string
	for p := range sources {
		names = append(names, p)
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var dirNames []string
	for d := range dirs {
		dirNames = append(dirNames, d)
	}
	sort.Strings(dirNames)
	sort.Strings(names)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range dirNames {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	for _, p := range names {
		data, err := os.ReadFile(sources[p])
		if err != nil {
			return nil, err
		}
		info, err := os.Stat(sources[p])
		if err != nil {
			return nil, err
		}
		mode := int64(info.Mode().Perm())
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: mode, Size: int64(len(data)), Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
