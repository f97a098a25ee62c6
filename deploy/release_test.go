package deploy

import (
	"os"
	"path"
	"path/filepath"
	"regexp"
	"testing"

	yamlv3 "go.yaml.in/yaml/v3"
)

// releaseWorkflow is what TestReleaseImage reads of .github/workflows/release.yml.
type releaseWorkflow struct {
	On struct {
		Push struct {
			Tags []string `yaml:"tags"`
		} `yaml:"push"`
	} `yaml:"on"`
	Jobs struct {
		Image struct {
			Env map[string]string `yaml:"env"`
		} `yaml:"image"`
	} `yaml:"jobs"`
}

// releaseTag is a tag the release workflow publishes: vMAJOR.MINOR.PATCH.
var releaseTag = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)

// TestReleaseImage: the kustomization names an image that a release pushes.
// The image is release.yml's IMAGE, and the tag is a vX.Y.Z that the
// workflow's tag filter starts it for and that it pushes as the image's tag
// (VERSION is the tag's name), so `git tag <newTag>` is the release the
// manifests need.
func TestReleaseImage(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", ".github", "workflows", "release.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var wf releaseWorkflow
	if err := yamlv3.Unmarshal(data, &wf); err != nil {
		t.Fatalf("release.yml: %v", err)
	}
	k := readKustomization(t)
	if len(k.Images) != 1 {
		t.Fatalf("kustomization.yaml: want one images entry, got %d", len(k.Images))
	}
	img := k.Images[0]
	env := wf.Jobs.Image.Env
	if img.NewName != env["IMAGE"] {
		t.Errorf("kustomization.yaml newName %q, want release.yml's IMAGE %q", img.NewName, env["IMAGE"])
	}
	if env["VERSION"] != "${{ github.ref_name }}" {
		t.Errorf("release.yml VERSION = %q: the test assumes the image's tag is the git tag's name", env["VERSION"])
	}
	if !releaseTag.MatchString(img.NewTag) {
		t.Errorf("kustomization.yaml newTag %q is not a release tag vX.Y.Z", img.NewTag)
	}
	started := false
	for _, pattern := range wf.On.Push.Tags {
		if ok, err := path.Match(pattern, img.NewTag); err != nil {
			t.Errorf("release.yml tag filter %q: %v", pattern, err)
		} else if ok {
			started = true
		}
	}
	if !started {
		t.Errorf("pushing tag %s would not start release.yml (on.push.tags %q)", img.NewTag, wf.On.Push.Tags)
	}
}
