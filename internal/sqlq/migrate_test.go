package sqlq

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"testing"
)

// releasedUp holds the SHA-256 of every up migration as it was committed.
// A schema's version stamp says which versions ran, not which text of them:
// an up migration edited after it reached main leaves every database that
// ran the earlier text at the same version with another shape, and migrate
// up finds "nothing to apply". An upgrade probe installed version 24 with
// the commit that introduced it (63fa53a, without the unconfirmed_freed
// column 83f914e added to the same file eleven minutes later): Start and
// migrate accepted the schema as version 24, and the engine's reaper failed
// every sweep ("column unconfirmed_freed does not exist"), so no expired
// lease was ever reaped. Change an applied schema with a new version; a
// change that matters only to fresh installs (as c6d8f44's to version 1)
// may update its hash here, saying so in the commit.
var releasedUp = map[string]string{
	"001_init.up.sql":                "0ea6c4b519d2b3f1cf86925506c0bc0032c9b6cd1491c6d9298665bc16a13384",
	"002_coordination.up.sql":        "5bc53bac31f84e8460bcb57bf9ae8ace601c8ed7b5e6380a775f79c84c938d85",
	"003_operations.up.sql":          "3159a47e694e23f2030f8cf244e80f04a6bfe53579398eb535df100ca6ecc475",
	"004_lookups.up.sql":             "329d8b59f9a11e0ded28018d2e7a293c4bf38a69f8d6181a7c5257a19196ecd7",
	"005_fanout_children.up.sql":     "8d485b17cca3b09c4ede5cf94cae109f3ded32c6d431adf9375ef2c50ffe8911",
	"006_key_leases.up.sql":          "96b069548547d4563683721a117f62691d19bcb0ef0c55d83e391fd9429cafde",
	"007_machines.up.sql":            "03e5254231865cfbb5fa140f07f089a89f97f6088df36b26dd376cb40338a87d",
	"008_autovacuum.up.sql":          "2c4bcc9e55586279ede6b107c7a3df16f43d8e9b05c94048020c2c0ef5d98bb4",
	"009_pick_by_id.up.sql":          "a48e98ba790f2483d4815858a1e4fc53c885f637bde6560cc065916eff885cae",
	"010_key_handoff.up.sql":         "762b418e00dac991e23a499b99ab45fa805b447e23c98d5091b2eb190601b44d",
	"011_pick_floor.up.sql":          "eecf673c0b48b47fa2dae31a721cf02e43b21fc00b9308d669c136ff6b2920fb",
	"012_fair_share.up.sql":          "996b172d835ebf66b0cb668389b8e7c32c170b2ac1f6c107abc64c76f7df3d2d",
	"013_pick_cursor.up.sql":         "eea19e9492affcc57332dbc73b15feee345759546d8aed2ebee81bdfd15fe3b0",
	"014_cancelled_leases.up.sql":    "014a0e96ab9a7344a4385175a1e94e23f9fb5e53214d27bdab76ce4f853a7937",
	"015_full_pick_floor.up.sql":     "088eabb4c089aaed2c1438448e3326939a6e6685a3bd6235b057e16898b6d772",
	"016_one_plain_statement.up.sql": "16a5edd7bb59e85fc5541b8fdfde55385f2104f82b450a7d2ddf43b756dd8bcd",
	"017_unstarted_claims.up.sql":    "c193ff05536ab9d1cd450b9f182856dc56da06391560180f7a7d7493faf5bbbd",
	"018_seen_at_timeout.up.sql":     "96a0f0c6c12ccbcaf9e678868a436ff3d899c42781f90f4a7ab7cf93a450bd2b",
	"019_outcome_tokens.up.sql":      "c5a6b45ea0763fd61bd588766f6084d240fce49548a0646b5757e80948ae1335",
	"020_fresh_inbox.up.sql":         "3de431f28ed5f9bff8312643cb32a796b2d114ce1b96d1bcad4175de036336f8",
	"021_walk_from_the_tail.up.sql":  "15741bc83f98c78e8019e7d936bbfbe0711eed1780927a30819a1df66985288b",
	"022_generic_plans.up.sql":       "eeaaef42ff6682a1b930a2d205d5ae476440038bbc04b02ed05730bcd8c83334",
	"023_keyed_room.up.sql":          "4627692329d985bb40325176729b20fff432c7ec2a30bb84b7f60641865b6cd8",
	"024_unconfirmed_claims.up.sql":  "5965ee74e4be31f0b8cdfa7903e5381ab01257c85063b4a75a297296ad7a504c",
}

func TestReleasedUpMigrationsAreNotEdited(t *testing.T) {
	ents, err := migrationFS.ReadDir("migrations")
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, ".up.sql") {
			continue
		}
		body, err := migrationFS.ReadFile("migrations/" + name)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(body)
		want, ok := releasedUp[name]
		if ok {
			seen++
		}
		switch {
		case !ok:
			t.Errorf("%s is not listed in releasedUp: add its hash once it is committed (%s)", name, hex.EncodeToString(sum[:]))
		case want != hex.EncodeToString(sum[:]):
			t.Errorf("%s was edited after it was released: databases that ran the earlier text keep its shape at the same version, "+
				"and migrate up does not apply the edit; add a new version instead", name)
		}
	}
	if seen != len(releasedUp) {
		t.Errorf("%d of %d released up migrations found: a released version was removed or renamed", seen, len(releasedUp))
	}
}

func TestOwnTablesAreTheMigrationsTables(t *testing.T) {
	got := slices.Sorted(slices.Values(ownTables()))
	want := []string{"gendurable_instances", "gendurable_key_buckets", "gendurable_machines", "gendurable_queues", "gendurable_signals"}
	if !slices.Equal(got, want) {
		t.Fatalf("ownTables() = %v, want %v", got, want)
	}
}
